"""Peak memory per rank and step time of one training step vs sequence length, SP 1 / 2 / 4 (CPU, gloo).

The tiny Zebra model (fp32, sdpa) trains on one row of ``length`` tokens: one sample, or packed samples
of 1/3 of the row (borders inside and across shards). Every SP size runs in the same invocation; SP 1 is the
plain one-process model and the baseline of the ratio columns.

Memory: how far the process's peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs`` once
model and batch exist) rises during the training steps, i.e. activations, gradients and temporaries — the
part SP divides — on the rank with the largest rise. Packed rows add the whole-row ``[T, T]`` block-diagonal mask of the CPU sdpa
path, which every rank holds (FlashAttention on GPUs needs none); single-sample rows use sdpa's causal flag. Time: median of ``--repeats`` steps on the slowest rank; the ranks share
the machine's cores, so SP on one CPU box shows the memory split, not a speed-up.

    python benchmarks/bench_sp.py --lengths 1024 2048 4096 --sizes 1 2 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _reset_peak() -> int:
    """Reset the peak resident set to the current one (Linux); returns the current one in kB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kb("VmRSS")


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def _batch(length: int, packed: bool) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    sample = max(length // 3, 1) if packed else length
    positions = torch.arange(length) % sample
    input_ids = torch.randint(1, 97, (1, length), generator=generator)
    return {"input_ids": input_ids, "position_ids": positions[None], "labels": input_ids.clone()}


def _measure(rank: int, world: int, length: int, packed: bool, repeats: int, out_dir: str) -> None:
    from llamafactory_zebra import ZebraConfig, ZebraForCausalLM
    from llamafactory_zebra.parallel import enable_sequence_parallel, new_layout, shard_batch

    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(OMP_NUM_THREADS="1")
        dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank, world_size=world)
    torch.manual_seed(0)
    config = ZebraConfig.from_preset("tiny", vocab_size=97, max_position_embeddings=max(length, 4096))
    config._attn_implementation = "sdpa"
    model = ZebraForCausalLM(config).train()
    batch = _batch(length, packed)
    if world > 1:
        layout = new_layout(world)
        enable_sequence_parallel(model, layout)
        batch = shard_batch(batch, layout)

    def step() -> None:
        model(**batch).loss.backward()
        model.zero_grad(set_to_none=True)

    resident = _reset_peak()
    step()  # warm-up (lazy inits); freed memory the allocator keeps is part of the peak from here on
    times = []
    for _ in range(repeats):
        if world > 1:
            dist.barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak_mb = (_status_kb("VmHWM") - resident) / 1024
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"peak_mb": peak_mb, "step_s": statistics.median(times)}, f)
    if world > 1:
        dist.destroy_process_group()


def run(length: int, packed: bool, sp: int, repeats: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(
            _measure, args=(sp, length, packed, repeats, out_dir), nprocs=sp, join=True, start_method="fork"
        )
        ranks = [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(sp)]
    return {"peak_mb": max(r["peak_mb"] for r in ranks), "step_s": max(r["step_s"] for r in ranks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if 1 not in args.sizes:
        raise SystemExit("--sizes must include 1: SP 1 is the baseline of the ratios")

    print("| row | tokens | SP | peak rise / rank (MB) | vs SP 1 | step (s) | vs SP 1 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for packed in (False, True):
        for length in args.lengths:
            results = {sp: run(length, packed, sp, args.repeats) for sp in sorted(args.sizes)}
            base = results[1]
            for sp, r in results.items():
                print(
                    f"| {'packed' if packed else 'one sample'} | {length} | {sp} | {r['peak_mb']:.1f} | "
                    f"{r['peak_mb'] / base['peak_mb']:.2f} | {r['step_s']:.3f} | {r['step_s'] / base['step_s']:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

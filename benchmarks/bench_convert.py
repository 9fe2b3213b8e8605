"""Wall time and peak RSS of ``llamafactory-zebra convert`` against loading + saving the base with transformers.

A randomly initialised checkpoint of Qwen3-1.7B's shape (bf16, tied embeddings, sharded safetensors) is
written to disk first (no hub access). Then, each in a fresh subprocess so ``ru_maxrss`` is its own:

- floor: ``AutoModelForCausalLM.from_pretrained(base, dtype=bfloat16)`` + ``save_pretrained`` — the least
  any tool that reads and rewrites the checkpoint does;
- convert: ``convert_checkpoint(base, out)`` with the defaults (7 MLA of 28 layers, ranks 1344/256).

Goal: convert ≤ 2x the floor's time, and peak RSS ≤ 1.5x one copy of the base weights.

Both write gigabytes into the page cache, which the kernel flushes to disk later: a point that starts
while the previous one's output is still being flushed competes with that writeback. So every point
starts after ``os.sync()`` (not timed), the two runs alternate for ``--repeats`` rounds (floor first in
odd rounds, convert first in even ones), and the table gives each run's median.

    python benchmarks/bench_convert.py --workdir /tmp/bench_convert [--layers 28] [--threads 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import time
from pathlib import Path

from subprocess_points import run_point

QWEN3_1_7B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}


def write_random_base(path: Path, layers: int) -> int:
    """Qwen3-shaped random bf16 weights in 2 GB shards; returns the bytes of weights written."""
    import torch
    from safetensors.torch import save_file

    config = {**QWEN3_1_7B, "num_hidden_layers": layers}
    hidden, inter, d = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (heads * d, hidden), p + "self_attn.k_proj.weight": (kv * d, hidden),
            p + "self_attn.v_proj.weight": (kv * d, hidden), p + "self_attn.o_proj.weight": (hidden, heads * d),
            p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
        })  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    shards, shard, shard_bytes, total = [], {}, 0, 0
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape, dtype=torch.bfloat16)
        else:
            tensor = (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)
        shard[name] = tensor
        shard_bytes += tensor.numel() * 2
        total += tensor.numel() * 2
        if shard_bytes > 2 * 1024**3:
            shards.append(shard)
            save_file(shard, str(path / f"part-{len(shards)}.safetensors"), metadata={"format": "pt"})
            shard, shard_bytes = {}, 0
    shards.append(shard)
    save_file(shard, str(path / f"part-{len(shards)}.safetensors"), metadata={"format": "pt"})
    weight_map = {}
    for number, names in enumerate(shards, start=1):
        final = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        (path / f"part-{number}.safetensors").rename(path / final)
        weight_map.update(dict.fromkeys(names, final))
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return total


def high_water_gib() -> float:
    """``VmHWM``: this process's peak resident set. Unlike ``ru_maxrss`` it starts afresh at ``exec``, so the
    parent's size (it has just written the base) does not leak into the point's number."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024**2
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def measure(kind: str, base: Path, output: Path, threads: int) -> dict:
    import torch

    if threads:
        torch.set_num_threads(threads)
    if kind == "floor":
        from transformers import AutoModelForCausalLM
    else:
        from llamafactory_zebra.convert import convert_checkpoint
    shutil.rmtree(output, ignore_errors=True)
    baseline = high_water_gib()
    cpu_start = cpu_seconds()
    start = time.perf_counter()
    if kind == "floor":
        AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16).save_pretrained(output)
    else:
        convert_checkpoint(base, output, progress=False, log=lambda _: None)
    seconds = time.perf_counter() - start
    cpu = cpu_seconds() - cpu_start
    peak = high_water_gib()
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_gib": peak, "rise_gib": peak - baseline}


def cpu_seconds() -> float:
    """User + system CPU time of every thread of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def median_point(points: list[dict]) -> dict:
    """The point of median wall time (its own RSS with it, so the row is one real run)."""
    return sorted(points, key=lambda point: point["seconds"])[len(points) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/tmp/bench_convert")
    parser.add_argument("--layers", type=int, default=28, help="decoder layers of the Qwen3-1.7B-shaped base")
    parser.add_argument("--threads", type=int, default=0, help="torch threads in both runs (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of both runs, alternating which goes first")
    parser.add_argument("--point", nargs=3, metavar=("KIND", "BASE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.point:
        kind, base, out = args.point
        print(json.dumps(measure(kind, Path(base), Path(out), args.threads)))
        return

    work = Path(args.workdir)
    base = work / "base"
    shutil.rmtree(work, ignore_errors=True)
    start = time.perf_counter()
    weight_bytes = write_random_base(base, args.layers)
    print(f"wrote a random Qwen3-1.7B-shaped base ({args.layers} layers, {weight_bytes / 1024**3:.2f} GiB bf16) "
          f"in {time.perf_counter() - start:.0f} s")  # fmt: skip
    runs: dict[str, list[dict]] = {"floor": [], "convert": []}
    for round_index in range(args.repeats):
        for kind in ("floor", "convert") if round_index % 2 == 0 else ("convert", "floor"):
            os.sync()
            extra = ["--threads", str(args.threads)]
            point = run_point(__file__, ["--point", kind, str(base), str(work / kind), *extra])
            if point is None:
                raise SystemExit(f"{kind}: killed (out of memory)")
            runs[kind].append(point)
            print(
                f"round {round_index + 1}: {kind} {point['seconds']:.1f} s wall, {point['cpu_seconds']:.1f} s CPU",
                flush=True,
            )
    results = {kind: median_point(points) for kind, points in runs.items()}
    weights_gib = weight_bytes / 1024**3
    floor, convert = results["floor"], results["convert"]
    print(
        f"| run (median of {args.repeats}) | wall s | CPU s | peak RSS GiB | RSS rise GiB | "
        f"peak RSS / weights ({weights_gib:.2f} GiB) |"
    )
    print("|---|---|---|---|---|---|")
    for kind, point in results.items():
        print(f"| {kind} | {point['seconds']:.1f} | {point['cpu_seconds']:.1f} | {point['peak_gib']:.2f} | "
              f"{point['rise_gib']:.2f} | {point['peak_gib'] / weights_gib:.2f} |")  # fmt: skip
    print(f"convert / floor wall time: {convert['seconds'] / floor['seconds']:.2f}x (goal <= 2x); "
          f"convert peak RSS / weights: {convert['peak_gib'] / weights_gib:.2f}x (goal <= 1.5x)")  # fmt: skip
    cores = len(os.sched_getaffinity(0))
    print(f"convert CPU s / {cores} cores = {convert['cpu_seconds'] / cores:.1f} s: no schedule of this work on this "
          f"machine beats it; 2x the floor is {2 * floor['seconds']:.1f} s")  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

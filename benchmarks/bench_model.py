"""Training throughput and peak memory: tiny Zebra vs a Qwen3 of the same width and depth, on CPU.

Each (model, length) point runs in a fresh subprocess so the peak resident set (``ru_maxrss``) belongs
to that point alone; the table reports the peak minus the resident set after the model is built, i.e.
what one forward+backward step at that length adds (activations, gradients, logits).

    python benchmarks/bench_model.py --lengths 1024 2048 4096 8192 16384 --steps 2
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from subprocess_points import run_point

WIDTH = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "vocab_size": 1024}


def build(kind: str):
    import torch

    if kind == "zebra":
        from llamafactory_zebra import ZebraConfig, ZebraForCausalLM

        config = ZebraConfig.from_preset("tiny", **WIDTH)
        config._attn_implementation = "sdpa"
        return ZebraForCausalLM(config)
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=16, **WIDTH)
    config._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(config).to(torch.float32)


def measure(kind: str, length: int, steps: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build(kind).train()
    tokens = torch.randint(0, WIDTH["vocab_size"], (1, length))
    baseline_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model(tokens, labels=tokens).loss.backward()  # warm-up (also the peak-memory step)
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    for _ in range(steps):
        model(tokens, labels=tokens).loss.backward()
        model.zero_grad(set_to_none=True)
    elapsed = (time.perf_counter() - start) / steps
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"tokens_per_s": length / elapsed, "step_s": elapsed, "peak_mib": (peak_kib - baseline_kib) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--point", nargs=2, metavar=("KIND", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.point:
        print(json.dumps(measure(args.point[0], int(args.point[1]), args.steps, args.threads)))
        return

    print(
        f"training step (fwd+bwd), batch 1, fp32, CPU threads={args.threads}; baseline: Qwen3 of the same width/depth"
    )
    print("| T | Zebra tok/s | Qwen3 tok/s | speed ratio | Zebra peak MiB | Qwen3 peak MiB | memory ratio |")
    print("|---|---|---|---|---|---|---|")
    for length in args.lengths:
        options = ["--steps", str(args.steps), "--threads", str(args.threads)]
        results = {kind: run_point(__file__, ["--point", kind, str(length), *options]) for kind in ("zebra", "qwen3")}
        if None in results.values():
            killed = [kind for kind, result in results.items() if result is None]
            print(f"| {length} | killed (out of memory): {', '.join(killed)} |||||")
            continue
        z, q = results["zebra"], results["qwen3"]
        print(
            f"| {length} | {z['tokens_per_s']:.0f} | {q['tokens_per_s']:.0f} | {z['tokens_per_s'] / q['tokens_per_s']:.2f} "
            f"| {z['peak_mib']:.0f} | {q['peak_mib']:.0f} | {z['peak_mib'] / q['peak_mib']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

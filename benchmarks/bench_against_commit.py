"""This checkout against another (e.g. the previous commit) in one run: GDN op and tiny-model training steps.

For a refactor that must not change speed. Each point runs in a fresh interpreter whose ``PYTHONPATH``
is one tree, so both trees' ``llamafactory_zebra`` are timed by the same script on the same inputs;
the two trees alternate point by point (``--repeats`` rounds, median), so load on a shared machine
hits both alike. Times are process CPU time of one step after a warm-up, on one thread: on a shared
machine wall time mostly measures the other jobs. Points:

- ``gdn-op``: ``ops.chunk_gated_delta_rule_torch`` forward+backward at the Zebra layer's shapes
  (H=6, K=256, V=512), as ``bench_gdn.py`` times it;
- ``model-plain`` / ``model-packing`` / ``model-neat``: one training step (fwd+bwd) of a tiny Zebra
  (sdpa) on one row of T tokens: unpacked, 8 samples marked by restarting ``position_ids``
  (LLaMA-Factory's ``packing``), and 8 samples as segment ids in the 2-D mask (``neat_packing``);
- ``serve-prefill``: ``ops.chunk_gated_delta_rule_in_slots`` (the vLLM layer's prompt op) on one request of
  T bf16 tokens at the same shapes, from a fresh state slot;
- ``serve-gdn-norm``: the GDN layer's gated RMSNorm (``ZebraGatedRMSNorm``) over T bf16 tokens of 6 heads
  x 512 values, no gradient (the norm the serving layer runs).

    git archive HEAD~1 | tar -x -C /tmp/baseline
    python benchmarks/bench_against_commit.py --baseline /tmp/baseline --length 2048 --repeats 5 [--points ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

POINTS = ("gdn-op", "model-plain", "model-packing", "model-neat", "serve-prefill", "serve-gdn-norm")
SAMPLES = 8
WIDTH = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "vocab_size": 1024}


def _step(kind: str, length: int):
    import torch

    torch.manual_seed(0)
    if kind == "gdn-op":
        from llamafactory_zebra.ops import chunk_gated_delta_rule_torch

        q, k = (torch.randn(1, length, 6, 256, requires_grad=True) for _ in range(2))
        v = torch.randn(1, length, 6, 512, requires_grad=True)
        g = -torch.rand(1, length, 6)
        beta = torch.rand(1, length, 6)
        return lambda: chunk_gated_delta_rule_torch(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0].sum().backward()

    if kind == "serve-prefill":
        from llamafactory_zebra.ops import chunk_gated_delta_rule_in_slots

        q, k = (torch.randn(1, length, 6, 256).bfloat16() for _ in range(2))
        v = torch.randn(1, length, 6, 512).bfloat16()
        g, beta = -torch.rand(1, length, 6) * 0.1, torch.rand(1, length, 6).bfloat16()
        cache = torch.zeros(2, 6, 512, 256).transpose(-1, -2)  # vLLM's [slots, H, V, K], read as [slots, H, K, V]
        borders, slot, fresh = torch.tensor([0, length]), torch.tensor([1]), torch.tensor([False])
        return lambda: chunk_gated_delta_rule_in_slots(
            q, k, v, g, beta, cache, slot, borders, fresh, use_qk_l2norm_in_kernel=True
        )
    if kind == "serve-gdn-norm":
        from llamafactory_zebra.layers.norms import ZebraGatedRMSNorm

        norm = ZebraGatedRMSNorm(512).requires_grad_(False)
        x, gate = (torch.randn(length, 6, 512).bfloat16() for _ in range(2))
        return lambda: norm(x, gate)

    from llamafactory_zebra import ZebraConfig, ZebraForCausalLM

    config = ZebraConfig.from_preset("tiny", **WIDTH)
    config._attn_implementation = "sdpa"
    model = ZebraForCausalLM(config).train()
    tokens = torch.randint(0, WIDTH["vocab_size"], (1, length))
    sample = torch.arange(length) // (length // SAMPLES)
    inputs = {"input_ids": tokens, "labels": tokens}
    if kind == "model-packing":
        inputs["position_ids"] = (torch.arange(length) % (length // SAMPLES))[None]
    elif kind == "model-neat":
        inputs["attention_mask"] = (sample + 1)[None]
        inputs["position_ids"] = (torch.arange(length) % (length // SAMPLES))[None]

    def step() -> None:
        model(**inputs).loss.backward()
        model.zero_grad(set_to_none=True)

    return step


def measure(kind: str, length: int, threads: int) -> float:
    import torch

    torch.set_num_threads(threads)
    step = _step(kind, length)
    step()  # warm-up
    start = time.process_time()
    step()
    return time.process_time() - start


def run_point(tree: Path, kind: str, length: int, threads: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    arguments = ["--point", kind, "--length", str(length), "--threads", str(threads)]
    run = subprocess.run([sys.executable, __file__, *arguments], env=env, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"{kind} in {tree} failed:\n{run.stderr[-3000:]}")
    result = json.loads(run.stdout.strip().splitlines()[-1])
    if not Path(result["package"]).is_relative_to(tree):
        raise RuntimeError(f"the point for {tree} imported {result['package']}: PYTHONPATH did not take effect")
    return result["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="a checkout of the commit to compare with")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--points", nargs="+", choices=POINTS, default=list(POINTS), help="the points to run")
    parser.add_argument("--point", choices=POINTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.point:
        import llamafactory_zebra

        seconds = measure(args.point, args.length, args.threads)
        print(json.dumps({"seconds": seconds, "package": llamafactory_zebra.__file__}))
        return
    if args.baseline is None:
        parser.error("--baseline DIR is required")

    trees = {"baseline": args.baseline.resolve(), "this": Path(__file__).resolve().parents[1]}
    times: dict[tuple[str, str], list[float]] = {(name, kind): [] for name in trees for kind in args.points}
    for round_index in range(args.repeats):
        order = list(trees.items()) if round_index % 2 == 0 else list(reversed(trees.items()))
        for kind in args.points:
            for name, tree in order:
                times[name, kind].append(run_point(tree, kind, args.length, args.threads))
        print_table(times, trees, args, rounds=round_index + 1)


def print_table(times: dict[tuple[str, str], list[float]], trees: dict[str, Path], args, rounds: int) -> None:
    """The medians so far (printed after every round, so a stopped run still reports)."""
    print(
        f"T={args.length}, threads={args.threads}, CPU seconds per step, median of {rounds} rounds (fresh process per point)"
    )
    print(f"baseline: {trees['baseline']}; this: {trees['this']}")
    print("| point | baseline s | this s | ratio this/baseline | spread (max/min, both trees) |")
    print("|---|---|---|---|---|")
    for kind in args.points:
        base, this = statistics.median(times["baseline", kind]), statistics.median(times["this", kind])
        every = times["baseline", kind] + times["this", kind]
        print(f"| {kind} | {base:.3f} | {this:.3f} | {this / base:.3f} | {max(every) / min(every):.2f} |", flush=True)


if __name__ == "__main__":
    main()

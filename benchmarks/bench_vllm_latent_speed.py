"""Serving speed of the latent MLA cache against the expanded layout: one Zebra, both layouts, one run.

The ~67M Zebra of ``bench_serve_online.py`` (released head shapes, 1:3 MLA:GDN), served twice at once by
``vllm serve`` (eager, the same options), once in the default latent layout and once with ``VLLM_MLA_DISABLE=1``
(expanded K/V), and measured in turn per repeat by ``vllm bench serve`` (``--num-prompts`` random prompts of each
length at once, ``--output-len`` tokens out). Prints time to first token and inter-token latency (p50, median over
the repeats) for both and their ratio, latent over expanded.

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/bench_vllm_latent_speed.py [--lengths 16384] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from bench_serve_online import LONG_CONTEXT_ZEBRA, REPO, serve_and_bench

from llamafactory_zebra.kernels.run_dtype import AUTO, DTYPES, describe_rates, matmul_rates, run_dtype
from llamafactory_zebra.testing.serving_checkpoint import build_checkpoint

LAYOUTS = {"latent": {}, "expanded": {"VLLM_MLA_DISABLE": "1"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="*", default=[16384])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=2)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--dtype", choices=[AUTO, *DTYPES], default=AUTO)
    parser.add_argument("--start-timeout", type=float, default=900)
    parser.add_argument("--client-timeout", type=float, default=3600)
    args = parser.parse_args()
    args.dtype = run_dtype(args.dtype)
    args.mamba_ssm_cache_dtype = "auto"
    rates = describe_rates(matmul_rates())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "3")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="bench_vllm_latent_speed_") as tmp:
        work = Path(tmp)
        build_checkpoint(work / "zebra", args.dtype, LONG_CONTEXT_ZEBRA)
        models = {name: work / "zebra" for name in LAYOUTS}
        results = serve_and_bench(list(LAYOUTS), models, args.lengths, False, args, work, LAYOUTS)

    print(
        f"\nvllm bench serve, random dataset: {args.num_prompts} prompts at once, {args.output_len} tokens out, "
        f"{args.repeats} runs per point (median), the layouts in turn per run; eager; {args.dtype}; "
        f"{os.cpu_count()} CPUs; {rates}"
    )
    print("| prompt tokens | TTFT p50 s latent / expanded | ratio | ITL p50 ms latent / expanded | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for length in args.lengths:
        ttft = {n: statistics.median(r["p50_ttft_ms"] / 1000 for r in results[n][length]) for n in LAYOUTS}
        itl = {n: statistics.median(r["p50_itl_ms"] for r in results[n][length]) for n in LAYOUTS}
        print(
            f"| {length} | {ttft['latent']:.2f} / {ttft['expanded']:.2f} | {ttft['latent'] / ttft['expanded']:.2f}x "
            f"| {itl['latent']:.1f} / {itl['expanded']:.1f} | {itl['latent'] / itl['expanded']:.2f}x |"
        )


if __name__ == "__main__":
    main()

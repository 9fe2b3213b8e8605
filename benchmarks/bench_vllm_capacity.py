"""Cache capacity as vLLM reports it: Zebra with the latent MLA cache, Zebra with expanded K/V, the dense Qwen3.

The pair of ``bench_serve_online.py`` (a ~67M Zebra with the released head shapes and 1:3 MLA:GDN plan, a dense
Qwen3 of the same parameter count), each started by ``vllm serve`` with ``--max-model-len`` ``--capacity-len`` in
the same ``VLLM_CPU_KVCACHE_SPACE``; the Zebra in its default latent layout (with default flags, with a bf16 GDN
state, without prefix caching: vLLM's ``align`` mode keeps two state pages per GDN layer and request, one
without) and with ``VLLM_MLA_DISABLE=1`` (the expanded layout). From each server's own log: the KV cache size in tokens, the maximum concurrency at
``--capacity-len`` tokens per request, the block size vLLM set for the hybrid and how much it padded the GDN state
pages; the MLA bytes per token are the layer's page row (``ZebraConfig.mla_cache_channels`` or the expanded
K/V) in the cache dtype. The last column is each concurrency over the dense model's, measured in this run.

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/bench_vllm_capacity.py [--dtype bfloat16] [--capacity-len 32768]
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path

from bench_serve_online import REPO, build_pair, capacity

BLOCK_LINE = re.compile(r"Setting attention block size to (\d+) tokens")
PADDING_LINE = re.compile(r"Padding mamba page size by ([\d.]+)%")
# label: (model, VLLM_MLA_DISABLE, extra ``vllm serve`` options)
RUNS = {
    "Zebra, latent MLA cache (default flags)": ("zebra", None, ()),
    "Zebra, latent, --mamba-ssm-cache-dtype bfloat16": ("zebra", None, ("--mamba-ssm-cache-dtype", "bfloat16")),
    "Zebra, latent, --no-enable-prefix-caching": ("zebra", None, ("--no-enable-prefix-caching",)),
    "Zebra, expanded K/V (VLLM_MLA_DISABLE=1)": ("zebra", "1", ()),
    "Qwen3 dense (vLLM's own)": ("qwen3", None, ()),
}


def mla_bytes_per_token(model_dir: Path, expanded: bool, itemsize: int) -> int:
    """One MLA layer's cache bytes per token in the served layout (``mla.cache_values_per_token``)."""
    from transformers import AutoConfig

    import llamafactory_zebra  # noqa: F401  (registers model_type zebra)
    from llamafactory_zebra.serving.vllm.mla import EXPANDED, LATENT, cache_values_per_token

    config = AutoConfig.from_pretrained(model_dir)
    return cache_values_per_token(config, EXPANDED if expanded else LATENT) * itemsize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--capacity-len", type=int, default=32768)
    parser.add_argument("--start-timeout", type=float, default=900)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "6")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    itemsize = 2 if args.dtype == "bfloat16" else 4

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_vllm_capacity_") as tmp:
        work = Path(tmp)
        models = build_pair(work, args.dtype)
        for index, (label, (model, mla_disable, extra)) in enumerate(RUNS.items()):
            os.environ.pop("VLLM_MLA_DISABLE", None)
            if mla_disable:
                os.environ["VLLM_MLA_DISABLE"] = mla_disable
            name = f"run{index}-{model}"
            tokens, concurrency = capacity(name, models[model], args.capacity_len, args, work, extra)
            log = (work / f"{name}-capacity-server.log").read_text()
            block, padding = BLOCK_LINE.search(log), PADDING_LINE.search(log)
            per_token = mla_bytes_per_token(models[model], bool(mla_disable), itemsize) if model == "zebra" else None
            rows.append(
                (label, tokens, concurrency, block[1] if block else "-", padding[1] if padding else "-", per_token)
            )
        os.environ.pop("VLLM_MLA_DISABLE", None)

    dense = rows[-1][2]
    print(
        f"\nvLLM's own capacity report at {args.capacity_len} tokens per request, "
        f"VLLM_CPU_KVCACHE_SPACE={os.environ['VLLM_CPU_KVCACHE_SPACE']} GiB, {args.dtype}, {os.cpu_count()} CPUs"
    )
    print(
        "| model | MLA B/token/layer | block size | GDN page padding | cache size, tokens | max concurrency | vs dense |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, tokens, concurrency, block, padding, per_token in rows:
        print(
            f"| {label} | {per_token if per_token is not None else '-'} | {block} | "
            f"{padding + '%' if padding != '-' else '-'} | {tokens:,} | {concurrency:.2f}x | {concurrency / dense:.1f}x |"
        )


if __name__ == "__main__":
    main()

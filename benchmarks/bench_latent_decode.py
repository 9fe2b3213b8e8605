"""Decode attention from the latent cache (``ops/latent_attention``) against the expanded layout, one thread.

Per row (context length, batch, dtype), in one run on the same machine:

- latent: what a decode step does per MLA layer on the latent cache, paged (``--block-size``, pages in
  random order): the query absorbed into latent space (``w_nope ⊙ W_UK``), ``latent_decode_cpu`` over the
  ``R + P + kv`` rows, then ``W_UV`` on its output;
- expanded: dense GQA attention over the expanded keys and values at the same length (``sdpa`` with
  ``enable_gqa``, contiguous ``[B, kv, S, D]`` tensors: no paging cost, the baseline's best case).

Released 7MLA21GDN shapes (``testing/latent_cache.RELEASED``: 16 query heads, 8 key heads, latent 256,
rope 64, nope 64, value 128). Times are the median of ``--repeats`` calls, the two sides interleaved so
drift on a shared machine hits both. Cache bytes per token and layer are printed with each row.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_latent_decode.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from llamafactory_zebra.ops.latent_attention.cpu_decode import latent_decode_cpu
from llamafactory_zebra.testing.latent_cache import RELEASED, make_problem

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def medians_ms(functions, repeats: int) -> list[float]:
    for fn in functions:
        fn()
    times = [[] for _ in functions]
    for _ in range(repeats):
        for fn, spent in zip(functions, times, strict=True):
            started = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - started)
    return [statistics.median(spent) * 1000 for spent in times]


def row(context: int, batch: int, dtype: torch.dtype, block_size: int, repeats: int) -> str:
    s = RELEASED
    problem = make_problem(s, [context] * batch, block_size, dtype=dtype, fill=0.0)
    gen = torch.Generator().manual_seed(1)
    query = torch.randn(batch, s.heads, s.nope_dim + s.rope_dim, generator=gen).to(dtype)
    w_uk = (problem.w_uk * problem.w_nope[:, None]).to(dtype)  # [kv, nope, R], w_nope folded in
    w_uv = problem.w_uv.to(dtype)
    group = s.heads // s.kv_heads
    scale = (s.nope_dim + s.rope_dim) ** -0.5

    def latent():
        q_nope = query[..., : s.nope_dim].reshape(batch, s.kv_heads, group, s.nope_dim)
        q_latent = torch.einsum("bkgn,knr->bkgr", q_nope, w_uk).reshape(batch, s.heads, s.latent_dim)
        context_latent = latent_decode_cpu(
            q_latent, query[..., s.nope_dim :], problem.cache, problem.block_table, problem.seq_lens,
            scale, s.kv_heads, s.scales_offset,
        )  # fmt: skip
        out = torch.einsum("bkgr,kvr->bkgv", context_latent.view(batch, s.kv_heads, group, -1), w_uv)
        return out.reshape(batch, s.heads, s.v_dim)

    keys = torch.randn(batch, s.kv_heads, context, s.nope_dim + s.rope_dim, generator=gen).to(dtype)
    values = torch.randn(batch, s.kv_heads, context, s.v_dim, generator=gen).to(dtype)

    def expanded():
        return F.scaled_dot_product_attention(query[:, :, None], keys, values, scale=scale, enable_gqa=True)

    latent_ms, expanded_ms = medians_ms([latent, expanded], repeats)
    element = torch.empty((), dtype=dtype).element_size()
    latent_bytes = s.row * element
    expanded_bytes = s.kv_heads * (s.nope_dim + s.rope_dim + s.v_dim) * element
    name = next(key for key, value in DTYPES.items() if value == dtype)
    return (
        f"| {context:,} | {batch} | {name} | {latent_ms:.2f} | {expanded_ms:.2f} | {latent_ms / expanded_ms:.2f}x "
        f"| {latent_bytes:,} | {expanded_bytes:,} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), block size {args.block_size}")
    print(
        "| context | batch | dtype | latent ms | expanded ms | latent / expanded | latent B/token | expanded B/token |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for dtype in args.dtypes:
        for batch in args.batches:
            for context in args.contexts:
                print(row(context, batch, DTYPES[dtype], args.block_size, args.repeats), flush=True)


if __name__ == "__main__":
    main()

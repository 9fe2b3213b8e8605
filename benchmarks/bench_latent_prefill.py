"""Prefill attention from the latent cache (``ops/latent_attention/prefill.py``) against the expanded layout,
one thread, at the released 7MLA21GDN head shapes (``testing/latent_cache.RELEASED``).

Per row (prompt length, cached context, dtype), in one run on the same machine, a chunk of ``prompt``
new tokens after ``context`` cached ones:

- latent: ``latent_prefill_cpu`` over the paged latent rows (block ``--block-size``), expanding every
  cached token a key block at a time through explicit ``W_UK``/``W_UV`` (what the vLLM layer's ``expand``
  does with ``kv_b_proj``);
- expanded: ``kv_b_proj`` of the new tokens only (the expanded layout caches keys and values, so earlier
  tokens are read, not recomputed), then causal GQA ``sdpa`` over contiguous ``[kv, S, D]`` keys and
  values, bottom-right aligned through an explicit mask when there is context.

Times are the median of ``--repeats`` calls, the two sides interleaved.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_latent_prefill.py
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from bench_latent_decode import DTYPES, medians_ms

from llamafactory_zebra.ops.latent_attention.prefill import latent_prefill_cpu
from llamafactory_zebra.testing.latent_cache import RELEASED, make_problem


def row(prompt: int, context: int, dtype: torch.dtype, block_size: int, repeats: int) -> str:
    s = RELEASED
    length = context + prompt
    problem = make_problem(s, [length], block_size, dtype=dtype, fill=0.0)
    gen = torch.Generator().manual_seed(1)
    query = torch.randn(prompt, s.heads, s.nope_dim + s.rope_dim, generator=gen).to(dtype)
    scale = (s.nope_dim + s.rope_dim) ** -0.5
    query_start_loc = torch.tensor([0, prompt], dtype=torch.int32)
    keywords = dict(latent_dim=s.latent_dim, rope_dim=s.rope_dim, kv_heads=s.kv_heads, scales_offset=s.scales_offset)

    def latent():
        return latent_prefill_cpu(
            query, problem.cache, problem.block_table, query_start_loc, problem.seq_lens, problem.expand, scale,
            **keywords,
        )  # fmt: skip

    new_latent = problem.latents[0][context:]
    new_rope, new_scales = problem.ropes[0][context:], problem.scales[0][context:]
    keys = torch.randn(s.kv_heads, length, s.nope_dim + s.rope_dim, generator=gen).to(dtype)
    values = torch.randn(s.kv_heads, length, s.v_dim, generator=gen).to(dtype)
    mask = None
    if context:
        mask = torch.ones(prompt, length, dtype=torch.bool).tril(context)

    def expanded():
        problem.expand(new_latent, new_rope, new_scales)  # the new tokens' keys and values
        return F.scaled_dot_product_attention(
            query.transpose(0, 1), keys, values, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
        )

    latent_ms, expanded_ms = medians_ms([latent, expanded], repeats)
    name = next(key for key, value in DTYPES.items() if value == dtype)
    return (
        f"| {prompt:,} | {context:,} | {name} | {latent_ms:.1f} | {expanded_ms:.1f} | {latent_ms / expanded_ms:.2f}x |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--contexts", type=int, nargs="+", default=[0, 4096])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), block size {args.block_size}")
    print("| new tokens | cached context | dtype | latent ms | expanded ms | latent / expanded |")
    print("|---:|---:|---|---:|---:|---:|")
    for dtype in args.dtypes:
        for context in args.contexts:
            for prompt in args.prompts:
                print(row(prompt, context, DTYPES[dtype], args.block_size, args.repeats), flush=True)


if __name__ == "__main__":
    main()

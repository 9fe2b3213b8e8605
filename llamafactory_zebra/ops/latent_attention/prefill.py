"""Prefill over the latent cache in bounded memory: cached tokens expanded a key block at a time, merged by
an online softmax.

Chunked prefill and prefix hits both read a request's whole context from the cache (its new rows are
written first). The reference expands every cached token to ``kv_heads × (Dqk + Dv)`` values and holds
``H × q × S`` scores: at 64K tokens and the released shapes, gigabytes per layer. Here each request's
pages go in key blocks of about :data:`KEY_BLOCK_TOKENS` (whole pages), each expanded once by the
caller's ``expand``; queries go in blocks that keep one score tile under :data:`SCORE_ELEMENTS` values;
each query keeps a running maximum, sum and weighted value sum per head across key blocks. Key blocks a
query block cannot see (causal, bottom-right: query ``i`` sees keys ``<= context + i``) are skipped, and
only the tiles the diagonal crosses are masked. GQA: the ``group`` query heads of a key head are one
matrix against that head's keys (one batched GEMM over key heads, keys never repeated).
"""

from __future__ import annotations

import torch

from .layout import check_prefill, compute_dtype
from .reference import Expand, no_queries_output

# Cached tokens expanded at once (rounded to whole pages, at least one): 2048 tokens x 8 key heads x
# (128 + 128) fp32 values are 16 MiB.
KEY_BLOCK_TOKENS = 2048
# Scores one tile may hold: 2**24 fp32 values are 64 MiB (plus their exponentials).
SCORE_ELEMENTS = 2**24


def latent_prefill_blocked(
    query: torch.Tensor,
    cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    expand: Expand,
    scale: float,
    *,
    latent_dim: int,
    rope_dim: int,
    kv_heads: int,
    scales_offset: int | None,
) -> torch.Tensor:
    """``[T, H, Dv]``: what ``reference.latent_prefill_reference`` returns, computed as the module docstring says."""
    check_prefill(query, cache, block_table, query_start_loc, seq_lens, latent_dim, rope_dim, kv_heads, scales_offset)
    tokens, heads, key_dim = query.shape
    group = heads // kv_heads
    dtype = compute_dtype(query, cache)
    block_size, row = cache.shape[1], cache.shape[2]
    pages_per_block = max(1, KEY_BLOCK_TOKENS // block_size)
    table = block_table.long()
    starts = query_start_loc.tolist()
    out = None
    for b, length in enumerate(seq_lens.tolist()):
        start, queries = starts[b], starts[b + 1] - starts[b]
        if queries == 0:
            continue
        context = length - queries
        # [kv, group, q, D], the softmax scale folded in.
        q = (query[start : start + queries].to(dtype) * scale).view(queries, kv_heads, group, key_dim)
        q = q.permute(1, 2, 0, 3)
        maximum = torch.full((kv_heads, group, queries), float("-inf"), dtype=dtype, device=query.device)
        total = torch.zeros_like(maximum)
        acc = None
        pages = -(-length // block_size)
        for first_page in range(0, pages, pages_per_block):
            first_key = first_page * block_size
            rows = cache.index_select(0, table[b, first_page : min(pages, first_page + pages_per_block)])
            rows = rows.view(-1, row)[: min(length, first_key + pages_per_block * block_size) - first_key]
            scales = None if scales_offset is None else rows[:, scales_offset : scales_offset + kv_heads]
            keys, values = expand(rows[:, :latent_dim], rows[:, latent_dim : latent_dim + rope_dim], scales)
            keys = keys.to(dtype).permute(1, 2, 0)  # [kv, D, n]
            values = values.to(dtype).transpose(0, 1)  # [kv, n, Dv]
            if acc is None:
                acc = torch.zeros(*maximum.shape, values.shape[-1], dtype=dtype, device=query.device)
            block_keys = keys.shape[-1]
            key_positions = torch.arange(first_key, first_key + block_keys, device=query.device)
            query_block = max(1, SCORE_ELEMENTS // (heads * block_keys))
            # Query i sees key first_key once context + i >= first_key: earlier queries skip the block.
            for q0 in range(max(0, first_key - context), queries, query_block):
                q1 = min(queries, q0 + query_block)
                scores = (q[:, :, q0:q1].reshape(kv_heads, group * (q1 - q0), key_dim) @ keys).view(
                    kv_heads, group, q1 - q0, block_keys
                )
                if first_key + block_keys - 1 > context + q0:  # the diagonal crosses this tile
                    query_positions = torch.arange(context + q0, context + q1, device=query.device)
                    hidden = key_positions[None, :] > query_positions[:, None]
                    scores = scores.masked_fill(hidden, float("-inf"))
                new_max = torch.maximum(maximum[:, :, q0:q1], scores.amax(dim=-1))
                weights = torch.exp(scores - new_max[..., None])
                correction = torch.exp(maximum[:, :, q0:q1] - new_max)
                total[:, :, q0:q1] = total[:, :, q0:q1] * correction + weights.sum(dim=-1)
                summed = (weights.view(kv_heads, group * (q1 - q0), block_keys) @ values).view(
                    kv_heads, group, q1 - q0, -1
                )
                acc[:, :, q0:q1] = acc[:, :, q0:q1] * correction[..., None] + summed
                maximum[:, :, q0:q1] = new_max
        result = (acc / total[..., None]).permute(2, 0, 1, 3).reshape(queries, heads, -1)
        if out is None:
            out = torch.empty(tokens, heads, result.shape[-1], dtype=query.dtype, device=query.device)
        out[start : start + queries] = result
    if out is None:
        return no_queries_output(query, cache, expand, latent_dim, rope_dim, kv_heads, scales_offset)
    return out

"""Prefill over the latent cache in bounded memory.

Chunked prefill and prefix hits both read a request's whole context from the cache (its new rows are
written first), so every cached token is expanded by the caller's ``expand`` to ``kv_heads × (Dqk + Dv)``
values. Per request, one of two ways, both causal bottom-right (query ``i`` sees keys ``<= context + i``)
and GQA (query head ``h`` reads key head ``h // group``, keys never repeated):

- a context whose expansion fits :data:`EXPANDED_ELEMENTS` is expanded at once into ``sdpa`` (PyTorch's
  fused kernel): one causal call for a whole prompt, else query blocks whose boolean mask stays under
  :data:`SCORE_ELEMENTS`;
- a longer one goes in key blocks of about :data:`KEY_BLOCK_TOKENS` (whole pages), each expanded once,
  against query blocks whose score tile stays under :data:`SCORE_ELEMENTS`; each query keeps a running
  maximum, sum and weighted value sum per head across key blocks (online softmax). Key blocks a query block
  cannot see are skipped, and only the tiles the diagonal crosses are masked.

So peak memory is set by these constants, not by the context: the reference's ``H × q × S`` scores and
whole expansion would be gigabytes per layer at 64K tokens and the released shapes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .layout import check_prefill, compute_dtype, request_rows
from .reference import Expand, no_queries_output

# Expanded keys plus values one request may hold at once (estimated with values as wide as keys, as
# Zebra's are): 2**25 fp32 values are 128 MiB, 16K tokens at the released 8 key heads x 128.
EXPANDED_ELEMENTS = 2**25
# Cached tokens a key block expands (rounded to whole pages, at least one): 2048 tokens x 8 key heads x
# (128 + 128) fp32 values are 16 MiB.
KEY_BLOCK_TOKENS = 2048
# Scores (or mask elements) one tile may hold: 2**24 fp32 values are 64 MiB.
SCORE_ELEMENTS = 2**24


def latent_prefill_cpu(
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
    dtype = compute_dtype(query, cache)
    starts = query_start_loc.tolist()
    out = None
    for b, length in enumerate(seq_lens.tolist()):
        start, queries = starts[b], starts[b + 1] - starts[b]
        if queries == 0:
            continue
        request = (query[start : start + queries].to(dtype), cache, block_table, b, length, expand, scale)
        layout = (latent_dim, rope_dim, kv_heads, scales_offset)
        if length * kv_heads * 2 * key_dim <= EXPANDED_ELEMENTS:
            result = _whole_context(*request, *layout)
        else:
            result = _key_blocks(*request, *layout)
        if out is None:
            out = torch.empty(tokens, heads, result.shape[-1], dtype=query.dtype, device=query.device)
        out[start : start + queries] = result
    if out is None:
        return no_queries_output(query, cache, expand, latent_dim, rope_dim, kv_heads, scales_offset)
    return out


def _expand_rows(rows, expand, latent_dim, rope_dim, kv_heads, scales_offset, dtype):
    """Keys ``[kv, n, D]`` and values ``[kv, n, Dv]`` of cache rows, in ``dtype``."""
    scales = None if scales_offset is None else rows[:, scales_offset : scales_offset + kv_heads]
    keys, values = expand(rows[:, :latent_dim], rows[:, latent_dim : latent_dim + rope_dim], scales)
    return keys.to(dtype).transpose(0, 1), values.to(dtype).transpose(0, 1)


def _whole_context(q, cache, block_table, b, length, expand, scale, latent_dim, rope_dim, kv_heads, scales_offset):
    """``[q, H, Dv]``: the request's context expanded at once, then ``sdpa``."""
    rows = request_rows(cache, block_table, b, length)
    keys, values = _expand_rows(rows, expand, latent_dim, rope_dim, kv_heads, scales_offset, q.dtype)
    q = q.transpose(0, 1)  # [H, q, D]
    queries = q.shape[1]
    context = length - queries
    if context == 0:  # a whole prompt: sdpa's causal (top-left) is bottom-right aligned here
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=scale, enable_gqa=True)
        return out.transpose(0, 1)
    block = max(1, SCORE_ELEMENTS // length)
    key_positions = torch.arange(length, device=q.device)
    outputs = []
    for q0 in range(0, queries, block):
        q1 = min(queries, q0 + block)
        visible = key_positions[None, :] <= torch.arange(context + q0, context + q1, device=q.device)[:, None]
        outputs.append(
            F.scaled_dot_product_attention(q[:, q0:q1], keys, values, attn_mask=visible, scale=scale, enable_gqa=True)
        )
    return torch.cat(outputs, dim=1).transpose(0, 1)


def _key_blocks(q, cache, block_table, b, length, expand, scale, latent_dim, rope_dim, kv_heads, scales_offset):
    """``[q, H, Dv]``: the request's context in key blocks, merged by an online softmax."""
    queries, heads, key_dim = q.shape
    group = heads // kv_heads
    dtype, device = q.dtype, q.device
    block_size, row = cache.shape[1], cache.shape[2]
    pages_per_block = max(1, KEY_BLOCK_TOKENS // block_size)
    context = length - queries
    q = (q * scale).view(queries, kv_heads, group, key_dim).permute(1, 2, 0, 3)  # [kv, group, q, D]
    maximum = torch.full((kv_heads, group, queries), float("-inf"), dtype=dtype, device=device)
    total = torch.zeros_like(maximum)
    acc = None
    pages = -(-length // block_size)
    table = block_table[b].long()
    for first_page in range(0, pages, pages_per_block):
        first_key = first_page * block_size
        rows = cache.index_select(0, table[first_page : min(pages, first_page + pages_per_block)])
        rows = rows.view(-1, row)[: min(length, first_key + pages_per_block * block_size) - first_key]
        keys, values = _expand_rows(rows, expand, latent_dim, rope_dim, kv_heads, scales_offset, dtype)
        keys = keys.transpose(1, 2)  # [kv, D, n]
        if acc is None:
            acc = torch.zeros(*maximum.shape, values.shape[-1], dtype=dtype, device=device)
        block_keys = keys.shape[-1]
        key_positions = torch.arange(first_key, first_key + block_keys, device=device)
        query_block = max(1, SCORE_ELEMENTS // (heads * block_keys))
        # Query i sees key first_key once context + i >= first_key: earlier queries skip the block.
        for q0 in range(max(0, first_key - context), queries, query_block):
            q1 = min(queries, q0 + query_block)
            tile = (kv_heads, group, q1 - q0, block_keys)
            scores = (q[:, :, q0:q1].reshape(kv_heads, -1, key_dim) @ keys).view(tile)
            if first_key + block_keys - 1 > context + q0:  # the diagonal crosses this tile
                query_positions = torch.arange(context + q0, context + q1, device=device)
                scores = scores.masked_fill(key_positions[None, :] > query_positions[:, None], float("-inf"))
            new_max = torch.maximum(maximum[:, :, q0:q1], scores.amax(dim=-1))
            weights = torch.exp(scores - new_max[..., None])
            correction = torch.exp(maximum[:, :, q0:q1] - new_max)
            total[:, :, q0:q1] = total[:, :, q0:q1] * correction + weights.sum(dim=-1)
            summed = (weights.view(kv_heads, -1, block_keys) @ values).view(*tile[:3], -1)
            acc[:, :, q0:q1] = acc[:, :, q0:q1] * correction[..., None] + summed
            maximum[:, :, q0:q1] = new_max
    return (acc / total[..., None]).permute(2, 0, 1, 3).reshape(queries, heads, -1)

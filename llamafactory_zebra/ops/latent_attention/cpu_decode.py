"""Absorbed latent decode on CPU in PyTorch: one GEMM per request chunk for all heads, no expansion.

Why this is fast where the reference is not: the reference gathers, casts and scores the latent and the
rope key separately per request and holds every score. Here, per request, the query's latent and rope
parts are one ``[H, R + P]`` matrix (``scale`` folded in), the rows are gathered page by page into one
contiguous ``[n, R + P]`` block, and one GEMM scores every head against it, another sums the latents: the
``H`` heads share one "key" (the latent), so BLAS sees a matrix product rather than ``H`` dot products.
A request longer than :data:`DECODE_CHUNK_TOKENS` goes in chunks of whole pages merged by an online
softmax (running maximum, sum and weighted latent per head), so memory stays bounded at any length.
Rows past a request's length are never read (the last page is cut at the length).
"""

from __future__ import annotations

import torch

from .layout import check_decode, compute_dtype

# Tokens a chunk gathers at most: 8192 rows of 328 fp32 values are 10 MiB, about a core's share of L3.
DECODE_CHUNK_TOKENS = 8192


def latent_decode_cpu(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    kv_heads: int,
    scales_offset: int | None,
) -> torch.Tensor:
    """``[T, H, R]``: what ``reference.latent_decode_reference`` returns, computed as the module docstring says."""
    check_decode(q_latent, q_rope, cache, block_table, seq_lens, kv_heads, scales_offset)
    heads, latent_dim = q_latent.shape[1:]
    key_dim = latent_dim + q_rope.shape[2]
    dtype = compute_dtype(q_latent, q_rope, cache)
    group = heads // kv_heads
    block_size, row = cache.shape[1], cache.shape[2]
    query = torch.cat((q_latent, q_rope), dim=-1).to(dtype) * scale
    table = block_table.long()
    chunk_blocks = max(1, DECODE_CHUNK_TOKENS // block_size)
    out = torch.empty(q_latent.shape, dtype=dtype, device=q_latent.device)
    for b, length in enumerate(seq_lens.tolist()):
        maximum = total = acc = None
        blocks = -(-length // block_size)
        for first in range(0, blocks, chunk_blocks):
            pages = table[b, first : min(blocks, first + chunk_blocks)]
            tokens = min(length, (first + len(pages)) * block_size) - first * block_size
            rows = cache.index_select(0, pages).view(-1, row)[:tokens]
            keys = rows[:, :key_dim].to(dtype)
            scores = query[b] @ keys.T  # [H, n]
            if scales_offset is not None:
                scales = rows[:, scales_offset : scales_offset + kv_heads].to(dtype).T  # [kv, n]
                scores = (scores.view(kv_heads, group, tokens) * scales[:, None]).view(heads, tokens)
            if first == 0 and tokens == length:  # one chunk: a plain softmax
                out[b] = torch.softmax(scores, dim=-1) @ keys[:, :latent_dim]
                continue
            chunk_max = scores.amax(dim=-1)
            new_max = chunk_max if maximum is None else torch.maximum(maximum, chunk_max)
            weights = torch.exp(scores - new_max[:, None])
            chunk_acc = weights @ keys[:, :latent_dim]
            if maximum is None:
                total, acc = weights.sum(dim=-1), chunk_acc
            else:
                correction = torch.exp(maximum - new_max)
                total = total * correction + weights.sum(dim=-1)
                acc = acc * correction[:, None] + chunk_acc
            maximum = new_max
        if acc is not None:
            out[b] = acc / total[:, None]
    return out.to(q_latent.dtype)

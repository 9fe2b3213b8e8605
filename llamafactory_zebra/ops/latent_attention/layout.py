"""What a paged latent-MLA cache holds, and the checks every latent attention function runs on its inputs.

A cache is ``[blocks, block_size, L]``; row ``t`` of request ``b`` lies in block
``block_table[b, t // block_size]`` at ``t % block_size``. A row is ``[latent R | rope key P | per-key-head
scales kv_heads (only for mla_norm qk_head) | padding]``, the layout ``layers/mla.py``'s ``cache_entry``
gives a token (the latent as it is, the rotated rope key, each key head's ``1 / rms``). The checks live
here once so the reference, the CPU path and the Triton kernel refuse the same bad inputs with the same
message.
"""

from __future__ import annotations

import torch


def _fail(name: str, problem: str) -> None:
    raise ValueError(f"latent attention: {name} {problem}")


def check_cache(cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """The cache is 3-D, the block table 2-D integer with one row per request, and every request's length
    fits the blocks its row can name."""
    if cache.dim() != 3:
        _fail("cache", f"must be [blocks, block_size, row], got shape {tuple(cache.shape)}")
    if block_table.dim() != 2 or block_table.dtype not in (torch.int32, torch.int64):
        _fail("block_table", f"must be a 2-D int32/int64 tensor, got {block_table.dtype} {tuple(block_table.shape)}")
    if seq_lens.dim() != 1 or seq_lens.shape[0] != block_table.shape[0]:
        _fail(
            "seq_lens", f"must be [B] with B = block_table rows ({block_table.shape[0]}), got {tuple(seq_lens.shape)}"
        )
    capacity = block_table.shape[1] * cache.shape[1]
    if seq_lens.numel() and int(seq_lens.max()) > capacity:
        _fail("seq_lens", f"max {int(seq_lens.max())} exceeds block_table width x block_size = {capacity}")


def check_row(row: int, latent_dim: int, rope_dim: int, kv_heads: int, scales_offset: int | None) -> None:
    """The latent, rope key and scales fit in a cache row of ``row`` values."""
    if kv_heads < 1:
        _fail("kv_heads", f"must be >= 1, got {kv_heads}")
    used = latent_dim + rope_dim
    if scales_offset is not None:
        if scales_offset < used:
            _fail("scales_offset", f"{scales_offset} overlaps the latent and rope key (R + P = {used})")
        used = scales_offset + kv_heads
    if used > row:
        _fail("cache", f"row of {row} values cannot hold R={latent_dim}, P={rope_dim} and the scales (needs {used})")


def check_decode(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_heads: int,
    scales_offset: int | None,
) -> None:
    """One query per request, ``H`` a multiple of ``kv_heads``, at least one cached token per request."""
    check_cache(cache, block_table, seq_lens)
    if q_latent.dim() != 3 or q_rope.dim() != 3 or q_latent.shape[:2] != q_rope.shape[:2]:
        _fail(
            "q_latent/q_rope", f"must be [T, H, R] and [T, H, P], got {tuple(q_latent.shape)}, {tuple(q_rope.shape)}"
        )
    tokens, heads, latent_dim = q_latent.shape
    if tokens != seq_lens.shape[0]:
        _fail("q_latent", f"has {tokens} queries for {seq_lens.shape[0]} requests: decode takes one query per request")
    if heads % max(kv_heads, 1):
        _fail("kv_heads", f"{kv_heads} does not divide the {heads} query heads")
    check_row(cache.shape[2], latent_dim, q_rope.shape[2], kv_heads, scales_offset)
    if seq_lens.numel() and int(seq_lens.min()) < 1:
        _fail("seq_lens", f"min {int(seq_lens.min())}: a decode request reads at least its own new token")


def check_prefill(
    query: torch.Tensor,
    cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    latent_dim: int,
    rope_dim: int,
    kv_heads: int,
    scales_offset: int | None,
) -> None:
    """Queries ``[T, H, D]`` split by ``query_start_loc`` ``[B + 1]``; each request has at least as many
    tokens as queries (its queries are its last tokens)."""
    check_cache(cache, block_table, seq_lens)
    if query.dim() != 3:
        _fail("query", f"must be [T, H, Dqk], got shape {tuple(query.shape)}")
    if query.shape[1] % max(kv_heads, 1):
        _fail("kv_heads", f"{kv_heads} does not divide the {query.shape[1]} query heads")
    check_row(cache.shape[2], latent_dim, rope_dim, kv_heads, scales_offset)
    if query_start_loc.dim() != 1 or query_start_loc.shape[0] != seq_lens.shape[0] + 1:
        _fail("query_start_loc", f"must be [B + 1] = [{seq_lens.shape[0] + 1}], got {tuple(query_start_loc.shape)}")
    starts = query_start_loc.tolist()
    if starts[0] != 0 or starts[-1] != query.shape[0] or any(b < a for a, b in zip(starts, starts[1:], strict=False)):
        _fail("query_start_loc", f"must rise from 0 to T = {query.shape[0]}, got {starts}")
    for b, (length, start, end) in enumerate(zip(seq_lens.tolist(), starts, starts[1:], strict=False)):
        if end - start > length:
            _fail(f"seq_lens[{b}]", f"= {length} is shorter than the request's {end - start} queries")


def request_rows(cache: torch.Tensor, block_table: torch.Tensor, request: int, length: int) -> torch.Tensor:
    """The first ``length`` cache rows of ``request``, ``[length, L]``, gathered from its blocks."""
    block_size = cache.shape[1]
    blocks = block_table[request, : -(-length // block_size)].long()
    return cache[blocks].reshape(-1, cache.shape[2])[:length]


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """fp32, or fp64 when an input is fp64: the softmax never runs in bf16/fp16."""
    dtype = torch.float32
    for tensor in tensors:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype

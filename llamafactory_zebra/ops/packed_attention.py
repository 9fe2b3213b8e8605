"""Causal attention over packed rows without a ``T x T`` mask: each sample attends to itself only.

FlashAttention's varlen kernel takes the samples' borders (``cu_seqlens``); PyPI has no flash-attn
wheel, so many GPU and most ROCm installs run sdpa, where the stock way to keep packed samples apart
is a dense ``[B, 1, T, T]`` mask (1 GiB of booleans per row at 32K tokens, four times that once sdpa
makes it additive) and a kernel that reads every masked-out score. These functions take the same
borders as FlashAttention and run PyTorch's own kernels instead:

- :func:`per_segment_sdpa`: one ``scaled_dot_product_attention(is_causal=True)`` call per sample. On
  CPU that is PyTorch's blockwise flash kernel (memory linear in the sample's length, backward
  included); the loop runs once per sample, which costs little next to the attention itself.
- :func:`flex_packed_attention`: ``flex_attention`` with a :class:`BlockMask` built from the borders
  (:func:`packed_block_mask`), compiled with ``torch.compile``: one kernel launch that skips the
  blocks no sample spans. Its backward runs on GPUs only (PyTorch 2.14 refuses flex backward on CPU).

Inputs and output follow transformers' attention functions: ``query`` ``[B, heads, T, qk]``, ``key``
``[B, kv_heads, T, qk]``, ``value`` ``[B, kv_heads, T, v]`` in, ``[B, T, heads, v]`` out; ``cu_seqlens``
are the borders over the flattened ``B * T`` tokens (``packing.cu_seqlens_from_segment_ids``, every row
start among them). The reference these are tested against is the dense block-causal mask
(``packing.block_causal_mask``) with plain eager attention.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from .fused_sdpa import fused_kernel_operands

# flex_attention's default tile (``_DEFAULT_SPARSE_BLOCK_SIZE``): the granularity at which it skips work.
FLEX_BLOCK_SIZE = 128


def _flatten_rows(x: torch.Tensor) -> torch.Tensor:
    """``[B, heads, T, D]`` → ``[1, heads, B * T, D]``: the rows end to end, as ``cu_seqlens`` count them."""
    batch, heads, length, dim = x.shape
    return x.transpose(0, 1).reshape(1, heads, batch * length, dim)


def _unflatten_rows(output: torch.Tensor, batch: int) -> torch.Tensor:
    """``[1, heads, B * T, D]`` → ``[B, T, heads, D]`` (contiguous, as transformers' attention functions return)."""
    _, heads, tokens, dim = output.shape
    return output.reshape(heads, batch, tokens // batch, dim).permute(1, 2, 0, 3).contiguous()


def per_segment_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Packed causal attention as one causal sdpa call per sample (``[B, T, heads, v]``).

    The operands are those of ``fused_sdpa.fused_kernel_operands`` (key/value heads repeated, heads padded to
    one size: a copy linear in ``T``), which PyTorch's fused CPU kernel takes; otherwise it would run the
    math kernel, which keeps every sample's ``T x T`` weights per head for backward (1 GiB for one 8K
    sample with 4 heads in fp32).
    """
    batch = query.shape[0]
    query, key, value = (_flatten_rows(x) for x in (query, key, value))
    query, key, value, value_dim = fused_kernel_operands(query, key, value)
    borders = cu_seqlens.tolist()
    outputs = [
        F.scaled_dot_product_attention(
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            dropout_p=dropout,
            is_causal=True,
            scale=scale,
        )
        for start, end in zip(borders[:-1], borders[1:], strict=True)
    ]
    return _unflatten_rows(torch.cat(outputs, dim=2)[..., :value_dim], batch)


def token_segments(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``[N]`` int32 segment index of each of the ``N = cu_seqlens[-1]`` tokens: 0, 0, 1, 1, 1, 2…

    >>> token_segments(torch.tensor([0, 2, 5, 6], dtype=torch.int32)).tolist()
    [0, 0, 1, 1, 1, 2]
    """
    tokens = int(cu_seqlens[-1])
    starts = torch.zeros(tokens, dtype=torch.int32, device=cu_seqlens.device)
    starts[cu_seqlens[1:-1].long()] = 1
    return starts.cumsum(0, dtype=torch.int32)


def packed_block_mask(cu_seqlens: torch.Tensor, block_size: int = FLEX_BLOCK_SIZE) -> BlockMask:
    """flex_attention's :class:`BlockMask` for causal attention within each segment of ``cu_seqlens``.

    Why not ``create_block_mask``: uncompiled, it evaluates the mask function on every one of the
    ``N x N`` token pairs — the dense mask this module exists to avoid — and compiled it is one more
    compilation per row length. Segment indices rise along the tokens, so a tile of ``block_size``
    queries and one of keys share a segment exactly when the key tile's last segment is at least the
    query tile's first; a tile is full (no mask needed inside it) when it lies below the diagonal and
    both tiles hold one and the same segment. That is ``(N / block_size)²`` booleans, not ``N²``.
    """
    tokens = int(cu_seqlens[-1])
    segments = token_segments(cu_seqlens)
    blocks = math.ceil(tokens / block_size)
    block_starts = torch.arange(blocks, device=segments.device) * block_size
    first = segments[block_starts]
    last = segments[(block_starts + block_size).clamp(max=tokens) - 1]
    below = torch.ones(blocks, blocks, dtype=torch.bool, device=segments.device).tril()
    strictly_below = below.tril(-1)
    shares = below & (last[None, :] >= first[:, None])
    single = first == last
    full = strictly_below & (single[:, None] & single[None, :] & (first[:, None] == first[None, :]))
    if tokens % block_size:  # the last query tile runs past the tokens: let the mask function see it
        full[-1] = False
    partial = shares & ~full

    def within_segment(batch, head, query_index, key_index):
        return (segments[query_index] == segments[key_index]) & (query_index >= key_index)

    def ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tiles = tiles.to(torch.int32)
        indices = torch.argsort(tiles, dim=-1, descending=True, stable=True).to(torch.int32)
        return tiles.sum(-1, dtype=torch.int32)[None, None], indices[None, None].contiguous()

    kv_num_blocks, kv_indices = ordered(partial)
    full_num_blocks, full_indices = ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num_blocks,
        kv_indices,
        full_num_blocks,
        full_indices,
        BLOCK_SIZE=block_size,
        mask_mod=within_segment,
        seq_lengths=(tokens, tokens),
    )


@functools.cache
def _compiled_flex_attention() -> Callable:
    # flex_attention is only fast (and only memory-linear) compiled; uncompiled it runs a math fallback.
    return torch.compile(flex_attention, dynamic=False)


def flex_packed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    compiled: bool = True,
    block_size: int = FLEX_BLOCK_SIZE,
) -> torch.Tensor:
    """Packed causal attention in one ``flex_attention`` call with :func:`packed_block_mask` (``[B, T, heads, v]``).

    ``compiled=False`` runs flex's eager fallback (dense scores: for tests on CPU only).
    """
    batch = query.shape[0]
    query, key, value = (_flatten_rows(x) for x in (query, key, value))
    block_mask = packed_block_mask(cu_seqlens, block_size)
    attend = _compiled_flex_attention() if compiled else flex_attention
    output = attend(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=key.shape[1] != query.shape[1])
    return _unflatten_rows(output, batch)

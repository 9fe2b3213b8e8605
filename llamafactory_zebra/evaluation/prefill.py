"""Chunked prefill: read a long prompt a few thousand tokens at a time through the model's own cache.

Each chunk's forward sees the cache of everything before it (for Zebra: the MLA latents and the
constant-size GDN states; for a plain transformer: its KV cache), so the activations alive at once
are those of one chunk — not of the whole prompt — and the result equals a one-shot forward. For
generation, transformers already does this with ``GenerationConfig.prefill_chunk_size``; eval-long
uses that. This module covers the cases ``generate`` does not: the per-position log-likelihood of a
long document (the perplexity curve), where every chunk's logits are needed but only one chunk's may
be alive at a time, and packed rows, which a decode cache cannot hold and are therefore split into
left-padded rows first.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..packing import packed_segment_ids

# Called with (chunk start, logits of the chunk [B, chunk, V]) as each chunk is computed.
ChunkCallback = Callable[[int, torch.Tensor], None]


@torch.no_grad()
def chunked_prefill(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    chunk_size: int = 8192,
    on_chunk: ChunkCallback | None = None,
):
    """Run ``input_ids`` ``[B, T]`` (left padding allowed) through ``model`` ``chunk_size`` tokens at a time.

    Returns the cache after the last token and the logits of the last position ``[B, V]``. ``on_chunk``
    receives every chunk's logits; without it only the last position's logits are computed.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    # Positions count from the first column, padding included, as in a one-shot forward without
    # position_ids: RoPE sees only differences, and restarting counts would read as packing.
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand_as(input_ids)
    cache, logits = None, None
    for start in range(0, input_ids.shape[1], chunk_size):
        end = min(start + chunk_size, input_ids.shape[1])
        outputs = model(
            input_ids=input_ids[:, start:end],
            attention_mask=attention_mask[:, :end],
            position_ids=positions[:, start:end],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=0 if on_chunk is not None else 1,
        )
        cache = outputs.past_key_values
        if on_chunk is not None:
            on_chunk(start, outputs.logits)
        logits = outputs.logits[:, -1]
    return cache, logits


def unpack_rows(
    input_ids: torch.Tensor, position_ids: torch.Tensor, pad_token_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int, int]]]:
    """Split packed rows (positions restart at each sample) into left-padded rows, one sample each.

    Returns the ids, the attention mask and, per new row, ``(packed row, start, end)`` of its tokens.
    """
    segments = packed_segment_ids(None, position_ids)
    if segments is None:
        segments = torch.ones_like(input_ids)
    spans = []
    for row in range(input_ids.shape[0]):
        ids = segments[row]
        for segment in ids.unique().tolist():
            where = (ids == segment).nonzero().flatten()
            spans.append((row, int(where[0]), int(where[-1]) + 1))
    longest = max(end - start for _, start, end in spans)
    out = input_ids.new_full((len(spans), longest), pad_token_id)
    mask = torch.zeros_like(out)
    for i, (row, start, end) in enumerate(spans):
        out[i, longest - (end - start) :] = input_ids[row, start:end]
        mask[i, longest - (end - start) :] = 1
    return out, mask, spans


@torch.no_grad()
def chunked_packed_logits(
    model: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, chunk_size: int, pad_token_id: int = 0
) -> torch.Tensor:
    """Logits ``[B, T, V]`` of a packed batch computed by chunked prefill of its unpacked samples."""
    rows, mask, spans = unpack_rows(input_ids, position_ids, pad_token_id)
    pieces: list[torch.Tensor] = []
    chunked_prefill(model, rows, mask, chunk_size, on_chunk=lambda start, logits: pieces.append(logits))
    unpacked = torch.cat(pieces, dim=1)
    out = unpacked.new_zeros(*input_ids.shape, unpacked.shape[-1])
    for i, (row, start, end) in enumerate(spans):
        out[row, start:end] = unpacked[i, unpacked.shape[1] - (end - start) :]
    return out

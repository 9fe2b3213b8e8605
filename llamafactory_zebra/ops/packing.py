"""Packed-sample borders (``cu_seqlens``) from what LLaMA-Factory's collators hand the model.

LLaMA-Factory packs several samples into one row two ways: ``packing`` restarts ``position_ids`` at 0
for every sample (padding tokens get position 0 too), and ``neat_packing`` writes segment ids
1, 2, 3, ... into a 2-D ``attention_mask`` with 0 for padding. Attention reads those directly; the GDN
recurrence and its convolutions need the borders as FlashAttention-style ``cu_seqlens`` over the
flattened ``B * T`` tokens, and transformers has no helper that returns them for a 2-D batch.
"""

from __future__ import annotations

import torch


def _check_rows(name: str, values: torch.Tensor) -> torch.Tensor:
    if not isinstance(values, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(values).__name__}.")
    if values.is_floating_point() or values.is_complex():
        raise ValueError(f"{name} must hold integers, got {values.dtype}.")
    if values.ndim == 1:
        values = values[None]
    if values.ndim != 2 or values.shape[1] == 0:
        raise ValueError(f"{name} must have shape [B, T] or [T] with T > 0, got {tuple(values.shape)}.")
    return values


def _cu_seqlens_from_starts(starts: torch.Tensor) -> torch.Tensor:
    """``starts``: ``[B, T]`` bool, True where a segment begins (always at column 0)."""
    starts = starts.clone()
    starts[:, 0] = True
    flat = starts.flatten()
    begin = torch.nonzero(flat).flatten()
    end = flat.new_tensor([flat.numel()], dtype=begin.dtype)
    return torch.cat([begin, end]).to(torch.int32)


def sample_starts_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool, True where a packed sample begins: at each row start and wherever the position
    does not continue the previous one (``p_t != p_{t-1} + 1``, e.g. a restart at 0)."""
    position_ids = _check_rows("position_ids", position_ids)
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    return starts


def is_packed(position_ids: torch.Tensor) -> bool:
    """Whether some row holds more than one sample (its positions restart or jump inside the row)."""
    return bool(sample_starts_from_position_ids(position_ids)[:, 1:].any())


def cu_seqlens_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """int32 ``[N + 1]`` borders over the flattened ``B * T`` tokens for ``packing`` batches.

    A sample starts at each row start and wherever ``position_ids`` does not continue by +1 (a
    restart at 0 in LLaMA-Factory). Padding (position 0 repeated) becomes one-token segments, so it
    never shares a state with real tokens. A row that starts mid-sample (sequence-parallel shards)
    is its own segment.
    """
    return _cu_seqlens_from_starts(sample_starts_from_position_ids(position_ids))


def cu_seqlens_from_segment_ids(segment_ids: torch.Tensor) -> torch.Tensor:
    """int32 ``[N + 1]`` borders over the flattened ``B * T`` tokens for ``neat_packing`` masks.

    ``segment_ids`` is ``[B, T]`` (or ``[T]``) with 1, 2, 3, ... per packed sample and 0 for padding.
    A segment starts at each row start and wherever the id changes, so each run of padding is a
    segment of its own: isolated from real tokens on both sides. A plain 0/1 attention mask works too
    (real tokens one segment, padding another).
    """
    segment_ids = _check_rows("segment_ids", segment_ids)
    if (segment_ids < 0).any():
        row, col = (int(i) for i in torch.nonzero(segment_ids < 0)[0])
        raise ValueError(
            f"segment_ids must be >= 0 (0 = padding), got {int(segment_ids[row, col])} at [{row}, {col}]."
        )
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    return _cu_seqlens_from_starts(starts)

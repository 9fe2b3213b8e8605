"""Where the independent sequences of a (possibly packed) batch start and end.

Every op in this package accepts either a plain batch ``[B, T, ...]`` (B independent sequences of
length T) or a packed batch ``[1, T_total, ...]`` with FlashAttention-style ``cu_seqlens``. Both are
reduced here to one list of (start, length) pairs over the flattened ``B * T`` tokens, so the torch
implementations need a single code path for both.
"""

from __future__ import annotations

import torch


def check_cu_seqlens_layout(cu_seqlens: torch.Tensor | None, batch_size: int) -> None:
    """Cheap checks that need no device sync (they also guard the fla path)."""
    if cu_seqlens is None:
        return
    if not isinstance(cu_seqlens, torch.Tensor):
        raise ValueError(f"cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}.")
    if cu_seqlens.ndim != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            f"cu_seqlens must be 1-D with N+1 >= 2 entries [0, end_1, ..., T], got shape {tuple(cu_seqlens.shape)}."
        )
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cu_seqlens must be int32 or int64, got {cu_seqlens.dtype}.")
    if batch_size != 1:
        raise ValueError(
            f"with cu_seqlens the batch size must be 1 (flatten packed rows to [1, T_total, ...]), got {batch_size}."
        )


def segment_bounds(
    batch_size: int, seq_len: int, cu_seqlens: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(starts, lengths)`` (CPU int64, one entry per sequence) over the flattened tokens.

    Validates the values of ``cu_seqlens``: starts at 0, never decreases, ends at ``seq_len``.
    Zero-length sequences are allowed (their final state equals their initial state).
    """
    if cu_seqlens is None:
        starts = torch.arange(batch_size, dtype=torch.int64) * seq_len
        return starts, torch.full((batch_size,), seq_len, dtype=torch.int64)
    check_cu_seqlens_layout(cu_seqlens, batch_size)
    cu = cu_seqlens.detach().to("cpu", torch.int64)
    if cu[0].item() != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {cu[0].item()}.")
    if cu[-1].item() != seq_len:
        raise ValueError(f"cu_seqlens must end at the sequence length {seq_len}, got {cu[-1].item()}.")
    lengths = cu[1:] - cu[:-1]
    if (lengths < 0).any():
        bad = int(torch.nonzero(lengths < 0)[0].item())
        raise ValueError(f"cu_seqlens must be non-decreasing, but entry {bad + 1} is smaller than entry {bad}.")
    return cu[:-1].clone(), lengths

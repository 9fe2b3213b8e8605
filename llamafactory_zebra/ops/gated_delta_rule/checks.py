"""Input validation shared by every gated-delta-rule entry point (fla layout ``[B, T, H, D]``)."""

from __future__ import annotations

import torch

from ..segments import check_cu_seqlens_layout


def check_gdn_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
) -> None:
    """Raise ``ValueError`` naming the offending argument; no device sync."""
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}.")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}.")
    if q.ndim != 4:
        raise ValueError(f"q must have shape [B, T, H, K], got {tuple(q.shape)}.")
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {tuple(q.shape)}, got {tuple(k.shape)}.")
    if v.ndim != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v must have shape [B, T, H, V] with B, T, H = {tuple(q.shape[:3])} (grouped value heads are "
            f"not supported), got {tuple(v.shape)}."
        )
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != q.shape[:3]:
            raise ValueError(f"{name} must have shape [B, T, H] = {tuple(q.shape[:3])}, got {tuple(t.shape)}.")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}.")
    for name, t in (("k", k), ("v", v), ("g", g), ("beta", beta)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}.")
    check_cu_seqlens_layout(cu_seqlens, q.shape[0])
    if initial_state is not None:
        num_seqs = q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
        expected = (num_seqs, q.shape[2], q.shape[3], v.shape[3])
        if tuple(initial_state.shape) != expected:
            raise ValueError(
                f"initial_state must have shape [N, H, K, V] = {expected} (N = number of sequences), "
                f"got {tuple(initial_state.shape)}."
            )
        if initial_state.device != q.device:
            raise ValueError(f"initial_state is on {initial_state.device} but q is on {q.device}.")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs are computed in fp32 (the recurrence loses too much in bf16); fp64 stays fp64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """fla's in-kernel normalisation: ``x / sqrt(sum(x^2) + eps)`` over the last dimension."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)

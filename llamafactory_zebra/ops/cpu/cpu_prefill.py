"""Prompt chunks of the gated delta rule on state slots, in C++ (``cpu_prefill.cpp``): the wrapper the op's
table maps its ``cpp`` entries to (``gated_delta_rule/in_slots.py``). Why the kernel exists, and the PyTorch
path it is tested against: ``gated_delta_rule/chunk_prefill.py``.
"""

from __future__ import annotations

import torch

from .build import cpu_kernels


def cpu_prefill_in_slots(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor,
    scale: float | None = None,
    *,
    use_qk_l2norm_in_kernel: bool = False,
    bf16_operands: bool = False,
) -> torch.Tensor:
    """``chunk_prefill.chunk_gated_delta_rule_prefill`` through ``cpu_prefill.cpp``, where the registry chose it
    (CPU bf16 or fp32 inputs on an fp32 state): the same arguments, with ``bf16_operands`` (bf16 GEMM
    operands, for bf16 inputs) in place of its ``matmul_dtype``."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return cpu_kernels().gated_delta_prefill_in_slots(
        q[0].contiguous(),
        k[0].contiguous(),
        v[0].to(q.dtype).contiguous(),
        g[0].float().contiguous(),
        beta[0].float().contiguous(),
        state,
        state_indices.long(),
        cu_seqlens.long(),
        has_initial_state,
        scale,
        use_qk_l2norm_in_kernel,
        bf16_operands,
    )[None]

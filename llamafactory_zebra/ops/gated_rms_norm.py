"""The gated RMSNorm that closes a GDN layer: ``rmsnorm(x) * weight * silu(gate)`` over each head's values.

The formula is fla's ``FusedRMSNormGated`` (statistics in at least fp32; fp64 stays fp64, so the fp64
reference tests stay exact); the training layer (``layers/norms.py``) and the vLLM layer ask this one op.
On a CPU, inference calls (no gradient) in bf16 or fp32 run one C++ pass per row
(``gated_rms_norm.cpp`` among the package's C++ CPU kernels, ``ops/cpu/``): written in PyTorch the
formula is about ten passes over the ``[tokens, heads, value dim]`` activations, and vLLM's own
``RMSNormGated`` runs exactly those passes on a CPU unless ``torch.compile`` fuses them (its eager mode,
``enforce_eager``). Its speed: ``benchmarks/bench_vllm_gdn_cpu.py``, ``docs/benchmarks.md``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels import Call, Key, Op, bind, run
from .cpu.gated_rms_norm import cpu_gated_rms_norm
from .recompute import recomputed


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight * silu(gate)`` over the last dimension, in x's dtype; the kernel
    is the registry's choice for this call (``kernels/registry.py``: the C++ pass for CPU inference)."""
    grad = torch.is_grad_enabled() and (x.requires_grad or gate.requires_grad or weight.requires_grad)
    call = Call.of(x, grad=grad, same_gate=gate.dtype == x.dtype and gate.shape == x.shape)
    return run(Op.GATED_NORM, call, x, gate, weight, eps)


def gated_rms_norm_reference(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The formula in PyTorch: the differentiable path, and the reference the C++ pass must equal. With
    gradients it keeps x, gate and weight for backward and runs the formula again there (``recompute.py``:
    autograd's gradients, bit for bit), not the formula's five activation-sized intermediates."""
    return recomputed(_gated_rms_norm_formula, x, gate, weight, eps)


def _gated_rms_norm_formula(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    compute_dtype = torch.promote_types(x.dtype, torch.float32)
    hidden = x.to(compute_dtype)
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    hidden = weight.to(compute_dtype) * hidden * F.silu(gate.to(compute_dtype))
    return hidden.to(x.dtype)


bind(Op.GATED_NORM, {Key.CPP: cpu_gated_rms_norm, Key.TORCH: gated_rms_norm_reference})

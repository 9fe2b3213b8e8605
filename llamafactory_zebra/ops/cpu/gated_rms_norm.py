"""The gated RMSNorm that closes a GDN layer, one C++ pass per row (``gated_rms_norm.cpp``): the wrapper the
op's table maps its ``cpp`` entry to. Why the kernel exists, and the PyTorch formula it must equal:
``ops/gated_rms_norm.py``.
"""

from __future__ import annotations

import torch

from .build import cpu_kernels


def cpu_gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``ops.gated_rms_norm`` through ``gated_rms_norm.cpp``, where the registry chose it (CPU bf16 or fp32
    inputs, no gradient): the arguments of the op's PyTorch path, ``gated_rms_norm_reference``."""
    return cpu_kernels().gated_rms_norm(x.contiguous(), gate.contiguous(), weight.float().contiguous(), eps)

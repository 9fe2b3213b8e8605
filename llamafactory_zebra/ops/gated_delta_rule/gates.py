"""The GDN layer's gates from its projections: the one home of the formula, for training and serving.

Per token and head (fla's ``GatedDeltaNet`` parametrisation)::

    beta = sigmoid(b)                                   write strength, in (0, 1)
    g    = -exp(A_log) * softplus(a + dt_bias)          log-decay, <= 0

Why not fla's (``fla.ops.gated_delta_rule.gate``, fla 0.6): the module imports Triton at import time and its PyTorch
reference ``naive_gdn_gate`` computes in fp32 only; this package imports fla solely for GPU tensors (the kernel
registry), and the fp64 reference runs need the gates in fp64. The few elementwise ops on ``[T, H]`` are not worth a
kernel next to the recurrence they feed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(g, beta)`` for the gated delta rule from the ``a_proj``/``b_proj`` outputs (``[..., H]``).

    ``g`` is computed in at least fp32 (fp64 for fp64 ``a``): bf16 rounding of the log-decay would be
    compounded over every step of the recurrence. ``beta`` keeps ``b``'s dtype. ``A_log`` and ``dt_bias``
    are ``[H]``. Differentiable in all four inputs.
    """
    dtype = torch.promote_types(a.dtype, torch.float32)
    g = -A_log.to(dtype).exp() * F.softplus(a.to(dtype) + dt_bias.to(dtype))
    return g, b.sigmoid()

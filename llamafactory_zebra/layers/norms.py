"""RMS norms of the Zebra blocks: Qwen3's plain one, and the gated one that closes a GDN mixer.

Statistics are computed in at least fp32 (fp64 stays fp64, so the fp64 reference tests stay exact).
"""

import torch
from torch import nn

from ..ops import gated_rms_norm


class ZebraRMSNorm(nn.Module):
    """Qwen3's RMSNorm (weight initialised to one, statistics in fp32)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.promote_types(input_dtype, torch.float32))
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class ZebraGatedRMSNorm(nn.Module):
    """``rmsnorm(x) * weight * silu(gate)`` over one head's value channels, as fla's ``FusedRMSNormGated``.

    The released GDN layers store it as ``o_norm.weight`` of size ``head_v_dim``; the formula is the op
    ``ops.gated_rms_norm`` (the vLLM layer asks it too).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(hidden_states, gate, self.weight, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"

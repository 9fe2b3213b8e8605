"""Math of the Zebra GDN layer, in fla's layout: fla's Triton kernels on GPUs, PyTorch elsewhere.

``ZEBRA_GDN_BACKEND=auto|torch|fla`` selects the implementation (see ``backend.py``). Modules never
import ``layers/``; layers call these functions.
"""

from .backend import BACKEND_ENV_VAR
from .causal_conv1d import causal_conv1d, causal_conv1d_update
from .gated_delta_rule import (
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_torch,
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gated_delta_rule_torch,
    naive_recurrent_gated_delta_rule,
)
from .packing import (
    cu_seqlens_from_position_ids,
    cu_seqlens_from_segment_ids,
    is_packed,
    sample_starts_from_position_ids,
)

__all__ = [
    "BACKEND_ENV_VAR",
    "causal_conv1d",
    "causal_conv1d_update",
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_torch",
    "cu_seqlens_from_position_ids",
    "cu_seqlens_from_segment_ids",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_torch",
    "is_packed",
    "naive_recurrent_gated_delta_rule",
    "sample_starts_from_position_ids",
]

"""Math of the Zebra GDN layer, in fla's layout: fla's Triton kernels on GPUs, PyTorch elsewhere; and MLA's
causal attention over packed rows on PyTorch's own kernels (``packed_attention.py``, imported from there).

Which implementation runs is the kernel registry's choice (``kernels/registry.py``;
``ZEBRA_GDN_BACKEND=auto|torch|fla`` among its switches). Modules never
import ``layers/``; layers call these functions. Packed-sample borders (``cu_seqlens``) come from
``llamafactory_zebra.packing``.
"""

from ..kernels import BACKEND_ENV_VAR
from .causal_conv1d import causal_conv1d, causal_conv1d_in_slots, causal_conv1d_update, causal_conv1d_update_in_slots
from .cpu import cpu_kernels
from .gated_delta_rule import (
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_in_slots,
    chunk_gated_delta_rule_torch,
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gated_delta_rule_in_slots,
    fused_recurrent_gated_delta_rule_torch,
    gdn_gates,
    naive_recurrent_gated_delta_rule,
)
from .gated_rms_norm import gated_rms_norm

__all__ = [
    "BACKEND_ENV_VAR",
    "causal_conv1d",
    "causal_conv1d_in_slots",
    "causal_conv1d_update",
    "causal_conv1d_update_in_slots",
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_in_slots",
    "chunk_gated_delta_rule_torch",
    "cpu_kernels",
    "gated_rms_norm",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_in_slots",
    "fused_recurrent_gated_delta_rule_torch",
    "gdn_gates",
    "naive_recurrent_gated_delta_rule",
]

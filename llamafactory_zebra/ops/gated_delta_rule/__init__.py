"""Gated delta rule: dispatching entry points, the PyTorch chunked/recurrent paths, and the reference."""

from .chunk import chunk_gated_delta_rule_torch
from .chunk_parallel import chunk_gated_delta_rule_parallel
from .dispatch import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from .fused_recurrent import fused_recurrent_gated_delta_rule_torch
from .gates import gdn_gates
from .in_slots import (
    chunk_gated_delta_rule_in_slots,
    fused_recurrent_gated_delta_rule_in_slots,
)
from .naive import naive_recurrent_gated_delta_rule

__all__ = [
    "chunk_gated_delta_rule_in_slots",
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_parallel",
    "chunk_gated_delta_rule_torch",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_in_slots",
    "fused_recurrent_gated_delta_rule_torch",
    "gdn_gates",
    "naive_recurrent_gated_delta_rule",
]

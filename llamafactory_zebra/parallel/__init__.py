"""Sequence parallelism for Zebra: one row spread over ``sp`` ranks, computed exactly as on one rank.

- ``rank_groups``: the ``dp x sp`` process groups (DeepSpeed's ``parallel_state_sp`` when DeepSpeed runs).
- ``context``: per-forward sample borders of whole rows (plain data), handed to the mixers.
- ``gdn``: convolution halo and affine state summaries for Gated DeltaNet.
- ``attention``: Ulysses all-to-all around transformers' attention functions for MLA.
- ``sharding``: shift labels, pad, cut rows; the loss normalisation across the group.
- ``collectives``: differentiable collectives that work on gloo subgroups.
"""

from .context import SequenceParallelContext, build_sequence_parallel_context, gather_row_segment_ids
from .model import enable_sequence_parallel
from .rank_groups import SequenceParallelLayout, layout_from_deepspeed, new_layout
from .sharding import pad_rows_for_sequence_parallel, shard_batch

__all__ = [
    "SequenceParallelContext",
    "SequenceParallelLayout",
    "build_sequence_parallel_context",
    "enable_sequence_parallel",
    "gather_row_segment_ids",
    "layout_from_deepspeed",
    "new_layout",
    "pad_rows_for_sequence_parallel",
    "shard_batch",
]

"""What one forward pass of a sequence-parallel rank knows about the whole rows it holds a shard of.

The model builds one :class:`SequenceParallelContext` per forward with
:func:`build_sequence_parallel_context` (one small all-gather of the position ids / 2-D mask) and hands
it to every mixer. The context is plain data, as fla's ``FLACPContext`` (``fla/ops/cp/context.py``);
the cross-rank pieces are functions of it: the convolution halo and the GDN state entering the shard
(``gdn.py``), the Ulysses attention wrapper (``attention.py``). Every rank holds an equal, contiguous
slice ``[offset, offset + T_local)`` of each of the ``B`` rows.

Sample borders are "runs" (``packing.run_ids``): maximal stretches of one segment id in a row, padding
runs included. The segment ids come from ``packing.row_segment_ids`` applied to whole rows, the rule
the single-process model applies, so SP and one process isolate exactly the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..packing import cu_seqlens_from_segment_ids, row_segment_ids, run_ids
from .collectives import gather_sequence
from .rank_groups import SequenceParallelLayout


@dataclass(frozen=True)
class SequenceParallelContext:
    layout: SequenceParallelLayout
    shard: slice  # this rank's positions in a whole row
    offset: int  # shard.start
    batch: int
    local_length: int
    global_runs: torch.Tensor  # [B, T] run ids over whole rows
    local_segment_ids: torch.Tensor  # [B, T_local]: 0 = padding, else one id per sample
    cu_seqlens: torch.Tensor  # borders of the local runs over the flattened B * T_local tokens
    continues: torch.Tensor  # [B] bool: the row's first local token continues the previous rank's sample
    continued_tokens: torch.Tensor  # [B, T_local] bool: tokens of a sample that began on an earlier rank
    first_run: torch.Tensor  # [B]: index (into the local cu_seqlens runs) of each row's first run
    last_run: torch.Tensor  # [B]: ... and of its last run


def gather_row_segment_ids(
    layout: SequenceParallelLayout, position_ids: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """``[B, T]`` segment ids of the whole rows, from every rank's shard of ``position_ids`` (and 2-D mask).

    Whole rows, so a shard that starts mid-sample is not mistaken for a new sample.
    """
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            "sequence parallelism takes a 2-D attention_mask (0/1 or neat-packing segment ids), got "
            f"{attention_mask.dim()}-D; Zebra builds block-diagonal masks itself"
        )
    full_positions = gather_sequence(position_ids.long(), layout.group)
    full_mask = None if attention_mask is None else gather_sequence(attention_mask.long(), layout.group)
    return row_segment_ids(full_mask, full_positions)


def build_sequence_parallel_context(
    layout: SequenceParallelLayout, segment_ids: torch.Tensor
) -> SequenceParallelContext:
    """The context of this rank's shard, from the ``[B, T]`` segment ids of the whole rows (every field).

    >>> from llamafactory_zebra.parallel import SequenceParallelLayout
    >>> rank1_of_2 = SequenceParallelLayout(group=None, rank=1, size=2, dp_rank=0, dp_size=1)
    >>> context = build_sequence_parallel_context(rank1_of_2, torch.tensor([[1, 1, 1, 1, 2, 2, 0, 0]]))
    >>> context.local_segment_ids.tolist(), context.cu_seqlens.tolist(), context.continues.tolist()
    ([[2, 2, 0, 0]], [0, 2, 4], [False])
    >>> context = build_sequence_parallel_context(rank1_of_2, torch.tensor([[1, 1, 1, 1, 1, 2, 2, 0]]))
    >>> context.cu_seqlens.tolist(), context.continues.tolist(), context.continued_tokens.tolist()
    ([0, 1, 3, 4], [True], [[True, False, False, False]])
    """
    batch, length = segment_ids.shape
    shard = layout.shard(length)
    local_length = length // layout.size
    global_runs = run_ids(segment_ids)
    local_runs = global_runs[:, shard]
    cu_seqlens = cu_seqlens_from_segment_ids(local_runs)
    if shard.start == 0:
        continues = torch.zeros(batch, dtype=torch.bool, device=segment_ids.device)
    else:
        continues = global_runs[:, shard.start - 1] == global_runs[:, shard.start]
    run_starts = cu_seqlens[:-1].long()
    row_starts = torch.arange(batch, device=run_starts.device) * local_length
    return SequenceParallelContext(
        layout=layout,
        shard=shard,
        offset=shard.start,
        batch=batch,
        local_length=local_length,
        global_runs=global_runs,
        local_segment_ids=segment_ids[:, shard],
        cu_seqlens=cu_seqlens,
        continues=continues,
        continued_tokens=continues[:, None] & (local_runs == local_runs[:, :1]),
        first_run=torch.searchsorted(run_starts, row_starts),
        last_run=torch.searchsorted(run_starts, row_starts + local_length) - 1,
    )

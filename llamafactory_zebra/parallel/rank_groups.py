"""Which ranks share one sequence: ``world = dp x sp``, each SP group a block of contiguous ranks.

Contiguous groups keep a sequence inside one node whenever ``sp`` divides the GPUs per node (the
all-to-all and the state all-gather then use the node's fabric) and match DeepSpeed's ALST layout, so
the same groups serve as DeepSpeed's ``mpu``. Groups are created by DeepSpeed's own
``parallel_state_sp`` when DeepSpeed is in use (:func:`layout_from_deepspeed`), otherwise by
:func:`new_layout`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed import ProcessGroup

from ..hparams.parallel_sizes import check_sequence_parallel_size, data_parallel_size


@dataclass(frozen=True)
class SequenceParallelLayout:
    """This rank's SP group; ``rank``/``size`` are within the group, ``dp_rank``/``dp_size`` across groups."""

    group: ProcessGroup | None
    rank: int
    size: int
    dp_rank: int
    dp_size: int

    def shard(self, length: int) -> slice:
        """The positions of a ``length``-token row this rank holds (``length`` divisible by ``size``)."""
        if length % self.size:
            raise ValueError(f"sequence length {length} must divide by sequence_parallel_size={self.size}")
        local = length // self.size
        return slice(self.rank * local, (self.rank + 1) * local)


def _layout(group: ProcessGroup | None, sp: int) -> SequenceParallelLayout:
    rank = dist.get_rank()
    return SequenceParallelLayout(
        group=group, rank=rank % sp, size=sp, dp_rank=rank // sp, dp_size=data_parallel_size(dist.get_world_size(), sp)
    )


def new_layout(sp: int) -> SequenceParallelLayout:
    """Create the SP groups with ``torch.distributed`` (every rank must call this, same ``sp``)."""
    world = dist.get_world_size()
    check_sequence_parallel_size(sp, world)
    mine = None
    for first in range(0, world, sp):
        group = dist.new_group(list(range(first, first + sp)))
        if first <= dist.get_rank() < first + sp:
            mine = group
    return _layout(mine, sp)


def layout_from_deepspeed(sp: int):
    """Create the SP groups through DeepSpeed's ALST ``parallel_state_sp``; returns ``(layout, mpu)``.

    ``mpu`` is the module DeepSpeed expects as ``deepspeed.initialize(mpu=...)``: with it ZeRO shards
    over all ``dp x sp`` ranks and reduces gradients across them.
    """
    import deepspeed.comm
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    check_sequence_parallel_size(sp, dist.get_world_size())
    deepspeed.comm.init_distributed(dist_backend=dist.get_backend(), dist_init_required=False)
    if parallel_state_sp._SEQUENCE_PARALLEL_GROUP is None:
        parallel_state_sp.initialize_sequence_parallel(sp)
    return _layout(parallel_state_sp.get_sequence_parallel_group(), sp), parallel_state_sp

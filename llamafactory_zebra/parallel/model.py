"""Switch a (possibly PEFT- or DeepSpeed-wrapped) Zebra model to sequence-parallel forwards."""

from __future__ import annotations

from torch import nn

from .rank_groups import SequenceParallelLayout


def enable_sequence_parallel(model: nn.Module, layout: SequenceParallelLayout | None) -> int:
    """Give every module inside ``model`` that declares ``supports_sequence_parallel`` (``ZebraModel``) the
    layout (``None`` turns SP off); returns how many.

    From then on each forward takes one shard of every row (see ``sharding.shard_batch``). The flag keeps
    this package free of model imports: the model imports ``parallel``, not the other way round.
    """
    found = 0
    for module in model.modules():
        if getattr(type(module), "supports_sequence_parallel", False):
            module.sequence_parallel = layout
            found += 1
    if not found:
        raise ValueError(f"sequence parallelism is implemented for Zebra models; {type(model).__name__} holds none")
    return found

"""Switch a (possibly PEFT- or DeepSpeed-wrapped) Zebra model to sequence-parallel forwards."""

from __future__ import annotations

from torch import nn

from .layout import SequenceParallelLayout


def enable_sequence_parallel(model: nn.Module, layout: SequenceParallelLayout | None) -> int:
    """Give every ``ZebraModel`` inside ``model`` the layout (``None`` turns SP off); returns how many.

    From then on each forward takes one shard of every row (see ``sharding.shard_batch``).
    """
    from ..modeling_zebra import ZebraModel

    found = 0
    for module in model.modules():
        if isinstance(module, ZebraModel):
            module.sequence_parallel = layout
            found += 1
    if not found:
        raise ValueError(f"sequence parallelism is implemented for Zebra models; {type(model).__name__} holds none")
    return found

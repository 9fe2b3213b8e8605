"""One ``llamafactory-cli train`` run as the plugin's checks see it: :class:`TrainingRun`.

``integration/training.py``'s wrapper of ``get_train_args`` builds it once from what LLaMA-Factory parsed and
hands it to every step of ``TRAINING_STEPS``; every checker the steps call (the guard rails, sequence
parallelism, tiled MLP, distillation, the kernel choice, the resume rule) takes this one object, so a checker
reads LLaMA-Factory's arguments by name with their types (``run.model``: ``ModelArguments``, …) and the YAML's
path for its messages (``run.source``). It lives here, on the package's lowest floor beside
:class:`RunArguments`, so ``distill/`` and ``integration/`` both take it. LLaMA-Factory and the Zebra config are
imported for type checking only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .run_arguments import RunArguments
from .zebra_args import ZebraArguments

if TYPE_CHECKING:
    from llamafactory.extras.logging import _Logger
    from llamafactory.hparams import (
        DataArguments,
        FinetuningArguments,
        GeneratingArguments,
        ModelArguments,
        TrainingArguments,
    )

    from ..configuration_zebra import ZebraConfig


@dataclass(frozen=True)
class TrainingRun:
    """A run's parsed arguments, its checkpoint's Zebra config, where the arguments came from and the logger."""

    arguments: RunArguments
    config: ZebraConfig | None  # the checkpoint's Zebra config; None for a model that is not a Zebra checkpoint
    source: str  # where the arguments came from (the YAML file or the command line), for messages
    logger: _Logger  # LLaMA-Factory's parser logger (``info_rank0``, ``warning_rank0``)

    @property
    def model(self) -> ModelArguments:
        return self.arguments.model

    @property
    def data(self) -> DataArguments:
        return self.arguments.data

    @property
    def training(self) -> TrainingArguments:
        return self.arguments.training

    @property
    def finetuning(self) -> FinetuningArguments:
        return self.arguments.finetuning

    @property
    def generating(self) -> GeneratingArguments:
        return self.arguments.generating

    @property
    def zebra(self) -> ZebraArguments:
        return self.arguments.zebra

"""The training pipeline's one shape: a :class:`TrainingRun` and the steps over it.

``training.py``'s wrapper of ``get_train_args`` builds one run object from what LLaMA-Factory parsed and hands
it to each step of ``training.TRAINING_STEPS`` in turn. Every step has one signature, ``step(run) -> None``,
and lives with its feature (``sequence_parallel.py``, ``tiled_mlp.py``, ``distill.py``, ``kernel_choice.py``,
``guards.py``, ``resume.py``); a step that overrides one of LLaMA-Factory's arguments is a step of its own
whose :attr:`Step.overrides` names the argument and :attr:`Step.why` says why, so the table lists every
override the plugin makes before training starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..configuration_zebra import ZebraConfig
from ..hparams import RunArguments, ZebraArguments

if TYPE_CHECKING:
    from llamafactory.extras.logging import _Logger
    from llamafactory.hparams import DataArguments, FinetuningArguments, ModelArguments, TrainingArguments


@dataclass(frozen=True)
class TrainingRun:
    """One ``llamafactory-cli train`` run as the plugin's steps see it."""

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
    def zebra(self) -> ZebraArguments:
        return self.arguments.zebra


@dataclass(frozen=True)
class Step:
    name: str
    apply: Callable[[TrainingRun], None]
    why: str
    overrides: str | None = None  # the upstream argument the step sets, if it sets one


def run_steps(steps: tuple[Step, ...], run: TrainingRun) -> None:
    """Each step in order; a step that must stop the run raises (``ValueError`` with the fix)."""
    for step in steps:
        step.apply(run)

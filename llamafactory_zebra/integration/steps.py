"""The training pipeline's one shape: steps over one :class:`~..hparams.TrainingRun`.

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

from ..hparams import TrainingRun


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

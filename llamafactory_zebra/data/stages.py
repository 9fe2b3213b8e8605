"""Which LLaMA-Factory processor a dataset's rows feed, and what that processor needs of a converted row.

LLaMA-Factory's loader works for one stage per run (``pt``, ``sft``, ``rm``, ``kto``, ``ppo``; DPO, ORPO
and SimPO load their data as ``rm``), but its converters never see it: each shapes a row from the dataset
entry alone (``ranking``, ``kto_tag``), and the stage's processor then skips rows of the wrong shape with a
generic "Dropped invalid example" warning, or crashes on them (pre-training reads ``_prompt[0]``). The
loader seam records the stage while a run's datasets load (:func:`loading_stage`); the row guard reads it
(:func:`stage_for`) to check each row for the processor that will consume it. Without a recorded stage
(``data inspect``, a direct ``_load_single_dataset`` call) the entry's own shape decides, as upstream's
converter does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llamafactory.data.parser import DatasetAttr

PRETRAIN, SUPERVISED, PAIRWISE, FEEDBACK, UNSUPERVISED = "pt", "sft", "rm", "kto", "ppo"
STAGE_WORDS = {
    PRETRAIN: "pre-training (stage pt)",
    SUPERVISED: "supervised fine-tuning (stage sft)",
    PAIRWISE: "preference training (stage rm or dpo; pref_loss orpo/simpo)",
    FEEDBACK: "KTO (stage kto)",
    UNSUPERVISED: "PPO (stage ppo)",
}

_loading_stage: ContextVar[str | None] = ContextVar("llamafactory_zebra_loading_stage", default=None)


class StageMismatchError(ValueError):
    """A dataset entry whose shape the run's stage cannot train on (every row would be dropped or misread)."""


@contextmanager
def loading_stage(stage: str) -> Iterator[None]:
    """Marks the datasets loaded inside the block as feeding LLaMA-Factory's ``stage`` processor."""
    token = _loading_stage.set(stage)
    try:
        yield
    finally:
        _loading_stage.reset(token)


def stage_for(attr: DatasetAttr) -> str:
    """The stage being loaded, or the one the entry's shape implies when none is recorded."""
    stage = _loading_stage.get()
    if stage is not None:
        return stage
    if attr.ranking:
        return PAIRWISE
    return FEEDBACK if attr.kto_tag else SUPERVISED


def check_stage_fits(attr: DatasetAttr, stage: str, label: str) -> None:
    """Refuses an entry the stage cannot use, naming the dataset_info.json keys that would make it fit.

    Upstream says only "The dataset is not applicable in the current training stage." for a ``ranking``
    mismatch, and trains nothing (or the wrong thing) for a ``kto_tag`` mismatch.
    """
    where = f"Dataset '{label}' (its dataset_info.json entry)"
    if stage == PAIRWISE and not attr.ranking:
        raise StageMismatchError(
            f'{where} is not a preference dataset, and {STAGE_WORDS[stage]} needs one: add "ranking": true and '
            'map its "chosen" and "rejected" columns under "columns".'
        )
    if stage != PAIRWISE and attr.ranking:
        raise StageMismatchError(
            f'{where} has "ranking": true (a preference dataset), which {STAGE_WORDS[stage]} cannot train on: '
            'use it with stage rm or dpo, or remove "ranking" and map a "response" column.'
        )
    if stage == PAIRWISE and not (attr.chosen and attr.rejected):
        missing = " and ".join(f'"{name}"' for name in ("chosen", "rejected") if not getattr(attr, name))
        raise StageMismatchError(f'{where} has "ranking": true but maps no {missing} column under "columns".')
    if stage == FEEDBACK and not attr.kto_tag:
        raise StageMismatchError(
            f'{where} maps no "kto_tag" column, and {STAGE_WORDS[stage]} needs one: a column of true/false '
            'feedback per row, mapped under "columns".'
        )
    if stage not in (FEEDBACK, PRETRAIN) and attr.kto_tag:
        raise StageMismatchError(
            f'{where} maps a "kto_tag" column, so LLaMA-Factory shapes its rows as KTO feedback, which '
            f'{STAGE_WORDS[stage]} cannot train on: use it with stage kto, or remove "kto_tag" from "columns".'
        )


def processor_refusal(output: dict[str, Any], stage: str) -> tuple[str, str] | None:
    """Why (kind, detail) the stage's LLaMA-Factory processor would skip or crash on a converted row, or ``None``.

    Mirrors the checks of ``data/processor/*.py``: pre-training reads the first prompt turn's text; the
    others need an odd number of prompt turns and one (SFT), two (pairwise) or at least two (KTO) responses.
    """
    prompt, response = output["_prompt"] or [], output["_response"] or []
    if stage == PRETRAIN:
        text = prompt[0].get("content") if prompt else None
        return None if isinstance(text, str) and text.strip() else ("empty text", "it gave no text to pre-train on")
    wanted = {SUPERVISED: "exactly 1", PAIRWISE: "exactly 2", FEEDBACK: "2", UNSUPERVISED: "any number of"}[stage]
    counts_fit = {
        SUPERVISED: len(response) == 1,
        PAIRWISE: len(response) == 2,
        FEEDBACK: len(response) >= 2,
        UNSUPERVISED: True,
    }[stage]
    if len(prompt) % 2 == 1 and counts_fit:
        return None
    return (
        "broken role order",
        f"it gave {len(prompt)} prompt turn(s) and {len(response)} response(s); "
        f"{STAGE_WORDS[stage]} needs an odd number of prompt turns and {wanted} response(s)",
    )

"""Passkey SFT rows, generated offline: the context-extension papers' test as training data.

Why it exists: passkey retrieval (Landmark Attention, LongLoRA, YaRN, PoSE) is the long-context test a model
of any size can learn, because its answer repeats the needle's own words ("The pass key is N."): the copy an
induction head makes. The long-context quickstart teaches it with these rows and scores it with
``eval-long``'s ``passkey`` task, so the rows use that task's instruction, needle, question and answer prefix
(:mod:`llamafactory_zebra.evaluation.tasks`), and are sized in the model's own tokens with the template
training uses.

A share of the rows (``other_filler_share``) hides the needle in sentences of the retrieval grammar
(:func:`~llamafactory_zebra.data.retrieval_sft.filler_sentence`) instead of the standard filler, so the skill is
not tied to one filler. Keys have 3 to 8 digits (:data:`KEY_DIGITS`), so the model learns to copy a number of
any length and to stop where it ends.

No row is an ``eval-long`` sample, by construction: ``eval-long``'s passkey samples hide a key of
``TaskOptions.passkey_digits`` digits in its filler haystack (the standard filler unless the user names a text);
a row here with the standard filler never has a key of that length, and a row with that key length always has
the grammar's filler. (A first recipe left that length out of every row: the trained model then copied the
test's five digits and went on to a sixth, the lengths it had seen; docs/long-context.md.)
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..evaluation.haystack import NOISE_SENTENCES, Haystack, HaystackTooShort, noise_haystack
from ..evaluation.tasks import (
    PASSKEY_ANSWER_PREFIX,
    PASSKEY_INSTRUCTION,
    PASSKEY_QUESTION,
    TaskOptions,
    fit,
    insert_at_depths,
    passkey_needle,
)
from .retrieval_sft import Measure, Message, RetrievalOptions, filler_haystack

# Digit counts of training keys; eval-long's only with the grammar's filler (see the module docstring).
KEY_DIGITS = tuple(range(3, 9))


@dataclass(frozen=True)
class PasskeyOptions:
    """What the rows hold: key lengths (digit counts), the share of rows with the grammar filler, and the share
    that open with the papers' instruction (rows without it are shorter: more answers per training token)."""

    key_digits: tuple[int, ...] = KEY_DIGITS
    other_filler_share: float = 0.25
    instruction_share: float = 1.0

    def __post_init__(self) -> None:
        if not set(self.key_digits) - {TaskOptions.passkey_digits} or min(self.key_digits) < 1:
            raise ValueError(
                f"key_digits {self.key_digits}: need digit counts >= 1, at least one other than eval-long's "
                f"{TaskOptions.passkey_digits} (the standard filler's rows never take that one)"
            )
        for name in ("other_filler_share", "instruction_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} {getattr(self, name)}: need a share from 0 to 1")


def passkey_key(rng: random.Random, options: PasskeyOptions, standard_filler: bool) -> str:
    """A key of one of ``key_digits`` lengths; with the standard filler never of eval-long's length."""
    counts = [n for n in options.key_digits if not (standard_filler and n == TaskOptions.passkey_digits)]
    digits = rng.choice(counts)
    return str(rng.randrange(10 ** (digits - 1), 10**digits))


def make_passkey_row(
    rng: random.Random, length: int, haystack: Haystack, measure: Measure, options: PasskeyOptions
) -> list[Message]:
    """One passkey conversation of at most ``length`` tokens (``measure``: the template's count), filled close to
    it, the needle at a uniformly random depth. A row too short for the instruction goes without it."""
    key, depth = passkey_key(rng, options, haystack.sentences == list(NOISE_SENTENCES)), rng.random()
    opening = f"{PASSKEY_INSTRUCTION} " if rng.random() < options.instruction_share else ""
    state = rng.getstate()

    def build(budget: int, opening: str = opening) -> list[Message]:
        rng.setstate(state)
        context = insert_at_depths(haystack.take(max(budget, 0), rng), [(depth, passkey_needle(key))])
        return [
            {"role": "user", "content": f"{opening}{context}\n\n{PASSKEY_QUESTION}"},
            {"role": "assistant", "content": f"{PASSKEY_ANSWER_PREFIX} {key}."},
        ]

    what = f"a passkey row with a {len(key)}-digit key"
    try:
        return fit(build, length, measure, what)
    except HaystackTooShort:
        if not opening:
            raise
        return fit(lambda budget: build(budget, ""), length, measure, what)


def make_passkey_rows(
    rows: int,
    lengths: tuple[int, int],
    seed: int,
    measure: Measure,
    encode: Callable[[str], list[int]],
    options: PasskeyOptions,
) -> list[dict[str, Any]]:
    """``rows`` conversations, row ``i`` of at most a length drawn from ``lengths`` (inclusive); it depends only
    on (seed, lengths, i)."""
    haystacks = (noise_haystack(encode), filler_haystack(seed, RetrievalOptions(filler_number_share=0.0), encode))
    made = []
    for index in range(rows):
        rng = random.Random(f"passkey/{seed}/{lengths}/{index}")
        haystack = haystacks[rng.random() < options.other_filler_share]
        made.append({"messages": make_passkey_row(rng, rng.randint(*lengths), haystack, measure, options)})
    return made

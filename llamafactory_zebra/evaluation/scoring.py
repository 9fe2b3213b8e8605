"""RULER's two metrics and passkey's, applied to generated text.

``string_match_all``: the fraction of the reference strings that occur in the output (all needles of
a multi-value question, every variable of a chain, the ten common words), so a half-right answer
scores 0.5. ``string_match_part``: 1 when any reference occurs (QA, where any gold answer counts).
Matching is case-insensitive substring matching, as in RULER; a score is reported in percent.
``first_number``: 1 when the output's first number is the key (passkey; "123456" does not hold "12345").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from .tasks import FIRST_NUMBER, MATCH_ALL, MATCH_PART

_NUMBER = re.compile(r"\d+")


def match_all(prediction: str, references: Sequence[str]) -> float:
    text = prediction.lower()
    return sum(ref.lower() in text for ref in references) / len(references)


def match_part(prediction: str, references: Sequence[str]) -> float:
    text = prediction.lower()
    return float(any(ref.lower() in text for ref in references))


def first_number(prediction: str, references: Sequence[str]) -> float:
    found = _NUMBER.search(prediction)
    return float(found is not None and found.group() in references)


METRICS = {MATCH_ALL: match_all, MATCH_PART: match_part, FIRST_NUMBER: first_number}


def score_sample(prediction: str, references: Sequence[str], metric: str) -> float:
    """Score of one output in [0, 1]."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
    if not references:
        raise ValueError("a sample needs at least one reference answer")
    return METRICS[metric](prediction, references)


def mean_percent(scores: Iterable[float]) -> float | None:
    values = list(scores)
    return 100.0 * sum(values) / len(values) if values else None

"""Writes the quickstart's demo task: spell a number from 0 to 99 in English words.

Why this task: answers are short and checked by exact match, and a 4-layer, hidden-64 model learns the
rule (tens word, hyphen, ones word) from 84 examples in a couple of CPU minutes. The held-out part is
16 numbers between 21 and 99 that are not multiples of ten, so no training example contains them:
answering them right needs the composition, not recall.

Run from the repository root to regenerate ``quickstart_train.json`` and ``quickstart_heldout.json``:
    python examples/data/quickstart_numbers.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ONES = "zero one two three four five six seven eight nine".split()
TEENS = "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
HELD_OUT = 16
SEED = 1


def in_words(number: int) -> str:
    if number < 10:
        return ONES[number]
    if number < 20:
        return TEENS[number - 10]
    tens, ones = divmod(number, 10)
    return TENS[tens] if ones == 0 else f"{TENS[tens]}-{ONES[ones]}"


def example(number: int) -> dict[str, str]:
    return {"instruction": f"Write {number} in words.", "output": in_words(number)}


def split() -> tuple[list[int], list[int]]:
    """(train, held-out) numbers; held-out ones are compound (21..99, not multiples of ten)."""
    compound = [n for n in range(21, 100) if n % 10]
    held_out = sorted(random.Random(SEED).sample(compound, HELD_OUT))
    return [n for n in range(100) if n not in held_out], held_out


def main() -> None:
    here = Path(__file__).parent
    train, held_out = split()
    for name, numbers in (("quickstart_train.json", train), ("quickstart_heldout.json", held_out)):
        (here / name).write_text(json.dumps([example(n) for n in numbers], indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

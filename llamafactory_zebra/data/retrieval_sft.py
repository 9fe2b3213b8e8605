"""Long-context retrieval SFT data, generated offline: needles, several keys, several values, variable tracking.

Why it exists: the long-context quickstart needs training rows whose answers can only come from the
context (RULER's categories, as the recipe's ChatQA2 long SFT uses them), at a chosen length in the model's
own tokens, with nothing to download, and none of them an ``eval-long`` sample. ``eval-long`` accepts any
``--seed``, so different seeds are not enough; the names differ by construction instead:

- a key here is a pseudo-word like ``eval-long``'s (the same syllables, so the same tokens) with at least one
  consonant from :data:`KEY_MARKS`, letters ``eval-long``'s pseudo-words never use;
- a variable name here has 4 or 6 upper-case letters, never ``eval-long``'s 5.

Every sample of ``eval-long`` holds its key or its variable names, so none can appear in these rows
(``tests/data/test_retrieval_sft.py`` checks the alphabets and lengths against ``evaluation/tasks.py``).

A row is one conversation in LLaMA-Factory's ``sharegpt`` schema: the first user turn is the context
(filler sentences with the needles at random depths) followed by a question, as ``eval-long`` asks it; the
following user turns ask more questions about the same context, so one long prefill trains several
answers (LLaMA-Factory trains on every assistant turn). Answers start with ``eval-long``'s answer prefix for
their task, so the trained model meets that prefix in evaluation. The filler is sentences drawn from a small
grammar (nouns, verbs, colours, and now and then a number), so neither the position of the answer nor
"the only number in the text" gives it away once a row holds several needles.

Run it as ``llamafactory-zebra data retrieval-sft --help``: rows are sized with the model's tokenizer and
LLaMA-Factory's template (``data.cutoff.row_tokens``), the tokens training will see.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..evaluation.haystack import Haystack, HaystackTooShort, noise_haystack
from ..evaluation.tasks import (
    PSEUDO_WORD_CONSONANTS,
    PSEUDO_WORD_VOWELS,
    VARIABLE_LETTERS,
    VARIABLE_NAME_LENGTH,
    fit,
    insert_at_depths,
)
from .cutoff import row_tokens

# Consonants eval-long's pseudo-words never use; every key here holds at least one.
KEY_MARKS = "qwxy"
KEY_CONSONANTS = PSEUDO_WORD_CONSONANTS + KEY_MARKS
# Variable names one letter shorter or longer than eval-long's.
TRACKING_NAME_LENGTHS = (VARIABLE_NAME_LENGTH - 1, VARIABLE_NAME_LENGTH + 1)

Message = dict[str, str]
Measure = Callable[[list[Message]], int]

_NOUNS = (
    "grass sky sun river town bridge house road garden forest window door boat field hill lake city market "
    "tower wall island harbour valley letter song"
).split()
_ADJECTIVES = "green blue yellow old quiet wide long red bright cold warm small large dark busy calm".split()
_PEOPLE = (
    "the farmer",
    "the teacher",
    "a child",
    "the captain",
    "my friend",
    "the old man",
    "her sister",
    "the baker",
    "our neighbour",
)
_VERBS = ("walked to", "looked at", "painted", "cleaned", "visited", "left", "found", "watched", "described")
_SHORT = ("Here we go.", "There and back again.", "It was a long day.", "Nobody said a word.", "Then it rained.")


@dataclass(frozen=True)
class RetrievalOptions:
    """What one row holds. Counts are inclusive ranges; shares are the chance that a row carries that part."""

    needles: tuple[int, int] = (1, 4)
    questions: int = 4
    value_digits: tuple[int, int] = (7, 7)
    key_syllables: tuple[int, int] = (2, 4)
    multivalue_share: float = 0.2
    multivalue_count: tuple[int, int] = (2, 4)
    tracking_share: float = 0.2
    tracking_hops: tuple[int, int] = (1, 4)
    filler_number_share: float = 0.05
    filler_pool: int = 4000
    noise_filler_share: float = 0.0

    def __post_init__(self) -> None:
        for name in ("needles", "value_digits", "key_syllables", "multivalue_count", "tracking_hops"):
            low, high = getattr(self, name)
            if not (0 if name == "needles" else 1) <= low <= high:
                raise ValueError(f"{name}: need 1 <= low <= high (needles: 0 <= low), got {low}, {high}")
        if self.questions < 1:
            raise ValueError(f"questions: need at least 1, got {self.questions}")
        if not 0.0 <= self.noise_filler_share <= 1.0:
            raise ValueError(f"noise_filler_share: need a share from 0 to 1, got {self.noise_filler_share}")


def filler_sentence(rng: random.Random, number_share: float) -> str:
    """One sentence of the filler grammar; a ``number_share`` of them carry a number (not a needle's)."""
    roll = rng.random()
    if roll < number_share:
        return f"There were {rng.randrange(2, 100_000)} {rng.choice(_NOUNS)}s in the story."
    if roll < 0.45:
        return f"The {rng.choice(_NOUNS)} is {rng.choice(_ADJECTIVES)}."
    if roll < 0.9:
        person, verb = rng.choice(_PEOPLE), rng.choice(_VERBS)
        return f"{person[0].upper()}{person[1:]} {verb} the {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}."
    return rng.choice(_SHORT)


def filler_haystack(seed: int, options: RetrievalOptions, encode: Callable[[str], list[int]]) -> Haystack:
    """A cycling pool of grammar sentences; rows take consecutive runs of it from a random start."""
    rng = random.Random(f"{seed}/filler")
    pool = [filler_sentence(rng, options.filler_number_share) for _ in range(options.filler_pool)]
    return Haystack(pool, encode, cycle=True, source="retrieval filler grammar")


def key_name(rng: random.Random, syllables: tuple[int, int]) -> str:
    """A pseudo-word whose consonants come from KEY_CONSONANTS, at least one of them from KEY_MARKS."""
    consonants = [rng.choice(KEY_CONSONANTS) for _ in range(rng.randint(*syllables))]
    consonants[rng.randrange(len(consonants))] = rng.choice(KEY_MARKS)
    return "".join(consonant + rng.choice(PSEUDO_WORD_VOWELS) for consonant in consonants)


def tracking_name(rng: random.Random) -> str:
    """An upper-case variable name of one of TRACKING_NAME_LENGTHS letters."""
    return "".join(rng.choice(VARIABLE_LETTERS) for _ in range(rng.choice(TRACKING_NAME_LENGTHS)))


def _value(rng: random.Random, digits: tuple[int, int]) -> str:
    count = rng.randint(*digits)
    return str(rng.randrange(10 ** (count - 1), 10**count))


# The wording of eval-long's tasks (evaluation/tasks.py), so the trained model meets its prompts.
def _needle(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def _niah_question(key: str) -> tuple[str, str]:
    return (
        f"What is the special magic number for {key} mentioned in the provided text?",
        f"The special magic number for {key} mentioned in the provided text is",
    )


def _multivalue_question(key: str) -> tuple[str, str]:
    return (
        f"What are all the special magic numbers for {key} mentioned in the provided text?",
        f"The special magic numbers for {key} mentioned in the provided text are",
    )


def _tracking_question(value: str, names: Sequence[str]) -> tuple[str, str]:
    return (
        f"Find all variables that are assigned the value {value} in the text above.",
        f"According to the chain(s) of variable assignment in the text above, {len(names)} variables are "
        f"assigned the value {value}, they are:",
    )


@dataclass
class _Probe:
    """One question about the context, its answer, and the sentences it needs in the context."""

    question: str
    answer: str
    inserts: list[tuple[float, str]]


def _distinct(rng: random.Random, draw: Callable[[random.Random], str], used: set[str]) -> str:
    while (name := draw(rng)) in used:
        pass
    used.add(name)
    return name


def _probes(rng: random.Random, options: RetrievalOptions) -> tuple[list[_Probe], list[tuple[float, str]]]:
    """The questions of one row and every sentence to hide (needles of unasked keys included)."""
    used: set[str] = set()
    probes: list[_Probe] = []

    def new_key(rng: random.Random) -> str:
        return key_name(rng, options.key_syllables)

    for _ in range(rng.randint(*options.needles)):
        key, value = _distinct(rng, new_key, used), _value(rng, options.value_digits)
        question, prefix = _niah_question(key)
        probes.append(_Probe(question, f"{prefix} {value}.", [(rng.random(), _needle(key, value))]))
    if rng.random() < options.multivalue_share:
        key = _distinct(rng, new_key, used)
        count = rng.randint(*options.multivalue_count)
        values = list(dict.fromkeys(_value(rng, options.value_digits) for _ in range(count)))
        question, prefix = _multivalue_question(key)
        needles = [(rng.random(), _needle(key, value)) for value in values]
        probes.append(_Probe(question, f"{prefix} {', '.join(values)}.", needles))
    if rng.random() < options.tracking_share:
        chain = [_distinct(rng, tracking_name, used) for _ in range(rng.randint(*options.tracking_hops) + 1)]
        value = _value(rng, (5, 5))
        statements = [f"VAR {chain[0]} = {value}."] + [
            f"VAR {b} = VAR {a}." for a, b in zip(chain, chain[1:], strict=False)
        ]
        depths = sorted(rng.random() for _ in statements)
        question, prefix = _tracking_question(value, chain)
        probes.append(_Probe(question, f"{prefix} {' '.join(chain)}", list(zip(depths, statements, strict=True))))
    inserts = [insert for probe in probes for insert in probe.inserts]
    return rng.sample(probes, min(options.questions, len(probes))), inserts


def _conversation(context: str, probes: Sequence[_Probe]) -> list[Message]:
    messages: list[Message] = []
    for turn, probe in enumerate(probes):
        question = f"{context}\n\n{probe.question}" if turn == 0 else probe.question
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": probe.answer}]
    return messages


def make_row(
    rng: random.Random, length: int, haystack: Haystack, measure: Measure, options: RetrievalOptions
) -> list[Message]:
    """One conversation of at most ``length`` tokens (``measure``: the template's count), filled close to it.

    Questions that leave no room in ``length`` are left out (last first); their needles stay, as distractors,
    unless even one question does not fit with them: then only its own needles stay.
    """
    probes, inserts = _probes(rng, options)
    if not probes:
        raise ValueError("a row needs at least one question: raise needles, multivalue_share or tracking_share")
    state = rng.getstate()
    while True:

        def build(budget: int, asked: list[_Probe] = probes, hidden: list = inserts) -> list[Message]:
            rng.setstate(state)
            return _conversation(insert_at_depths(haystack.take(max(budget, 0), rng), hidden), asked)

        try:
            return fit(build, length, measure, f"a retrieval row of {len(inserts)} needles and one question")
        except HaystackTooShort:
            if len(probes) > 1:
                probes = probes[:-1]
            elif inserts != probes[0].inserts:
                inserts = probes[0].inserts
            else:
                raise


def make_rows(
    rows: int,
    lengths: tuple[int, int],
    seed: int,
    measure: Measure,
    encode: Callable[[str], list[int]],
    options: RetrievalOptions,
) -> list[dict[str, Any]]:
    """``rows`` conversations, row ``i`` of at most a length drawn from ``lengths`` (inclusive); it depends
    only on (seed, lengths, i).

    A ``noise_filler_share`` of the rows hide their needles in ``eval-long``'s noise haystack ("The grass is
    green. ...") instead of the grammar's sentences, so the skill meets the filler it is tested in; their keys
    still carry a :data:`KEY_MARKS` consonant, so none of them is an ``eval-long`` sample either."""
    haystacks = (filler_haystack(seed, options, encode), noise_haystack(encode))
    made = []
    for index in range(rows):
        rng = random.Random(f"{seed}/{lengths}/{index}")
        # Drawn only when asked for, so the rows of a share of 0 are the ones this function always wrote.
        haystack = haystacks[options.noise_filler_share > 0 and rng.random() < options.noise_filler_share]
        made.append({"messages": make_row(rng, rng.randint(*lengths), haystack, measure, options)})
    return made


SHAREGPT_ENTRY = {
    "formatting": "sharegpt",
    "columns": {"messages": "messages"},
    "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
}


def write_dataset(output_dir: str | Path, name: str, rows: list[dict[str, Any]]) -> Path:
    """``OUTPUT_DIR/NAME.json`` and its entry in ``OUTPUT_DIR/dataset_info.json`` (other entries kept)."""
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    data_file = output / f"{name}.json"
    data_file.write_text(json.dumps(rows, ensure_ascii=False) + "\n", encoding="utf-8")
    info_file = output / "dataset_info.json"
    info = json.loads(info_file.read_text(encoding="utf-8")) if info_file.is_file() else {}
    info[name] = {"file_name": data_file.name, **SHAREGPT_ENTRY}
    info_file.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return data_file


def template_measure(model: str, template: str) -> tuple[Measure, Callable[[str], list[int]]]:
    """Token counts as LLaMA-Factory's SFT preprocessing makes them (``data.cutoff.row_tokens``) with the
    model's tokenizer and the template, thinking off (the empty think block is part of the prompt, as
    training renders it); and the plain text encoder the filler is measured with."""
    from llamafactory.data import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    chat = get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template, enable_thinking=False))

    def measure(messages: list[Message]) -> int:
        return row_tokens(chat, tokenizer, messages)

    return measure, lambda text: tokenizer.encode(text, add_special_tokens=False)

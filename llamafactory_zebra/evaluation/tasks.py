"""RULER-style long-context tasks, generated offline and deterministically from a seed.

The six tasks follow the categories of NVIDIA's RULER benchmark (Hsieh et al., 2024): needle retrieval
with one key, with distractor keys and with several values per key; multi-hop variable tracking;
common-word aggregation; and question answering over one gold paragraph hidden among distractors.
RULER downloads its haystacks (Paul Graham essays, SQuAD/HotpotQA); here every piece of text is
built from a seeded random generator, or taken from a text the user supplies, so no network is
needed and a seed fixes every sample.

Each sample is sized in *tokens of the model under test*: ``measure`` counts the tokens of the prompt
as the model will read it (chat template and answer prefix included), and haystack sentences are
added until one more would exceed the target length.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from .haystack import Haystack, HaystackTooShort

# Token count of a whole prompt as the model will read it (chat template and answer prefix included).
Measure = Callable[["Sample"], int]

# Metric names as RULER calls them: the fraction of references found, or whether any one is found.
MATCH_ALL = "string_match_all"
MATCH_PART = "string_match_part"
# Passkey's metric (Landmark Attention, LongLoRA, YaRN, PoSE): the first number of the answer is the key.
FIRST_NUMBER = "first_number"

PSEUDO_WORD_CONSONANTS = "bcdfghjklmnprstvz"
PSEUDO_WORD_VOWELS = "aeiou"
# variable_tracking's names (``VAR ABCDE = 12345``): this many of these letters.
VARIABLE_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
VARIABLE_NAME_LENGTH = 5

Fitted = TypeVar("Fitted")


@dataclass(frozen=True)
class Sample:
    """One prompt to answer. ``depth`` (0-1) is where the needle sits, ``None`` for tasks without one."""

    task: str
    length: int
    index: int
    context: str
    question: str
    answer_prefix: str
    answers: tuple[str, ...]
    metric: str
    depth: float | None = None

    @property
    def prompt(self) -> str:
        return f"{self.context}\n\n{self.question}"


@dataclass(frozen=True)
class TaskOptions:
    """Knobs of the generators; the defaults are RULER's."""

    value_digits: int = 7
    multikey_distractors: int = 3
    multivalue_count: int = 4
    tracking_hops: int = 4
    tracking_chains: int = 1
    common_words: int = 10
    common_frequency: int = 30
    rare_frequency: int = 3
    qa_distractors: int = 10
    passkey_digits: int = 5


def pseudo_word(rng: random.Random, syllables: int = 3) -> str:
    """A pronounceable nonsense word: keys, variable-free names and places no model has memorised."""
    return "".join(rng.choice(PSEUDO_WORD_CONSONANTS) + rng.choice(PSEUDO_WORD_VOWELS) for _ in range(syllables))


def _number(rng: random.Random, digits: int) -> str:
    return str(rng.randrange(10 ** (digits - 1) if digits > 1 else 0, 10**digits))


def insert_at_depths(sentences: list[str], inserts: Sequence[tuple[float, str]]) -> str:
    """Place each ``(depth, text)`` between the haystack sentences at ``depth`` ∈ [0, 1]."""
    placed = list(sentences)
    for depth, text in sorted(inserts, key=lambda item: -item[0]):
        placed.insert(round(depth * len(sentences)), text)
    return " ".join(placed)


def fit(build: Callable[[int], Fitted], length: int, measure: Callable[[Fitted], int], what: str) -> Fitted:
    """The longest sample (``what``, for the error) whose prompt stays within ``length`` tokens.

    ``build(budget)`` makes a sample with about ``budget`` tokens of filler; the guess is corrected with
    the measured overshoot until the encoded prompt fits (BPE merges across sentence borders make the
    per-sentence counts an estimate only).
    """
    budget = length - measure(build(0))
    for _ in range(8):
        sample = build(budget)
        actual = measure(sample)
        if actual <= length:
            return sample
        budget -= actual - length + 1
        if budget <= 0:
            break
    raise HaystackTooShort(
        f"{what}: the question and needles alone take more than {length} tokens; use a larger length"
    )


def fill_haystack(
    template: Sample,
    inserts: Sequence[tuple[float, str]],
    rng: random.Random,
    haystack: Haystack,
    measure: Measure,
    preamble: str = "",
) -> Sample:
    """``template`` with a context of haystack sentences and ``inserts`` at their depths, fitted to its length.

    ``preamble`` opens the context before the haystack (passkey's instruction). Every attempt restarts ``rng``
    from the same state, so the fitted sample depends only on the seed.
    """
    state = rng.getstate()
    opening = f"{preamble} " if preamble else ""

    def build(budget: int) -> Sample:
        rng.setstate(state)
        return replace(template, context=opening + insert_at_depths(haystack.take(budget, rng), inserts))

    return fit(build, template.length, measure, template.task)


def _needle(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def _niah(
    task: str,
    keys: int,
    values: int,
    length: int,
    index: int,
    depth: float,
    rng: random.Random,
    haystack: Haystack,
    measure: Measure,
    options: TaskOptions,
) -> Sample:
    names = []
    while len(names) < keys:
        word = pseudo_word(rng)
        if word not in names:
            names.append(word)
    target = names[0]
    answers = tuple(dict.fromkeys(_number(rng, options.value_digits) for _ in range(values)))
    while len(answers) < values:
        answers = tuple(dict.fromkeys((*answers, _number(rng, options.value_digits))))
    inserts = [(depth, _needle(target, value)) for value in answers]
    inserts += [(rng.random(), _needle(name, _number(rng, options.value_digits))) for name in names[1:]]
    if values > 1:
        question = f"What are all the special magic numbers for {target} mentioned in the provided text?"
        prefix = f"The special magic numbers for {target} mentioned in the provided text are"
    else:
        question = f"What is the special magic number for {target} mentioned in the provided text?"
        prefix = f"The special magic number for {target} mentioned in the provided text is"
    template = Sample(task, length, index, "", question, prefix, answers, MATCH_ALL, depth)
    return fill_haystack(template, inserts, rng, haystack, measure)


def niah_single(length, index, depth, rng, haystack, measure, options) -> Sample:
    return _niah("niah_single", 1, 1, length, index, depth, rng, haystack, measure, options)


def niah_multikey(length, index, depth, rng, haystack, measure, options) -> Sample:
    keys = 1 + options.multikey_distractors
    return _niah("niah_multikey", keys, 1, length, index, depth, rng, haystack, measure, options)


def niah_multivalue(length, index, depth, rng, haystack, measure, options) -> Sample:
    return _niah("niah_multivalue", 1, options.multivalue_count, length, index, depth, rng, haystack, measure, options)


def variable_tracking(length, index, depth, rng, haystack, measure, options) -> Sample:
    """``VAR A = 12345``, then ``VAR B = VAR A`` … spread through the haystack; name every variable holding it."""
    inserts, answers = [], ()
    used: set[str] = set()
    for chain in range(options.tracking_chains):
        names = []
        while len(names) < options.tracking_hops + 1:
            name = "".join(rng.choice(VARIABLE_LETTERS) for _ in range(VARIABLE_NAME_LENGTH))
            if name not in used:
                used.add(name)
                names.append(name)
        value = _number(rng, 5)
        statements = [f"VAR {names[0]} = {value}."] + [
            f"VAR {b} = VAR {a}." for a, b in zip(names[:-1], names[1:], strict=True)
        ]
        depths = sorted(rng.random() for _ in statements)
        inserts += list(zip(depths, statements, strict=True))
        if chain == 0:
            answers, target = tuple(names), value
    question = f"Find all variables that are assigned the value {target} in the text above."
    prefix = (
        f"According to the chain(s) of variable assignment in the text above, {len(answers)} variables are "
        f"assigned the value {target}, they are:"
    )
    template = Sample("variable_tracking", length, index, "", question, prefix, answers, MATCH_ALL)
    return fill_haystack(template, inserts, rng, haystack, measure)


def common_words(length, index, depth, rng, haystack, measure, options) -> Sample:
    """A numbered word list where ``common_words`` words recur ``common_frequency`` times, the rest a few times."""
    question = f"What are the {options.common_words} most common words in the above list?"
    prefix = f"Answer: The top {options.common_words} words appearing most often in the list are:"
    # Enough distinct words for the whole length even if every entry were a single token.
    needed = options.common_words + length // options.rare_frequency + 1
    vocabulary = list(dict.fromkeys(pseudo_word(rng, rng.choice((2, 3, 4))) for _ in range(2 * needed)))
    common, rare = vocabulary[: options.common_words], vocabulary[options.common_words :]
    state = rng.getstate()

    def build(rare_count: int, frequency: int) -> Sample:
        rng.setstate(state)
        words = common * frequency + rare[:rare_count] * options.rare_frequency
        rng.shuffle(words)
        context = "Below is a numbered list of words. " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))
        return Sample("common_words", length, index, context, question, prefix, tuple(common), MATCH_ALL)

    # Short contexts cannot hold 10 × 30 repeats: lower the repeat count (keeping the common words
    # clearly more frequent than the rest) until they take at most half the length.
    frequency = options.common_frequency
    while measure(build(0, frequency)) > length // 2 and frequency > options.rare_frequency + 2:
        frequency -= 1
    overhead = measure(build(0, frequency))
    if overhead > length:
        raise HaystackTooShort(
            f"common_words: {options.common_words} words × {frequency} repeats alone take "
            f"{overhead} tokens, more than {length}; use a larger length"
        )
    entry_tokens = len(haystack.encode(f" {length}. {rare[0]}"))
    count = min(len(rare), (length - overhead) // (entry_tokens * options.rare_frequency))
    while True:
        sample = build(count, frequency)
        actual = measure(sample)
        if actual <= length:
            return sample
        count -= max(1, (actual - length) // (entry_tokens * options.rare_frequency))


def qa_synthetic(length, index, depth, rng, haystack, measure, options) -> Sample:
    """Paragraphs of made-up facts; one answers the question. RULER's QA task with generated documents."""
    relations = (
        ("capital", "The capital of {subject} is {answer}.", "What is the capital of {subject}?"),
        ("founder", "The city of {subject} was founded by {answer}.", "Who founded the city of {subject}?"),
        ("river", "The longest river of {subject} is the {answer}.", "What is the longest river of {subject}?"),
    )
    facts = []
    for _ in range(options.qa_distractors + 1):
        name, statement, question = rng.choice(relations)
        subject, answer = pseudo_word(rng).capitalize(), pseudo_word(rng).capitalize()
        facts.append((statement.format(subject=subject, answer=answer), question.format(subject=subject), answer))
    gold_statement, question, answer = facts[0]
    inserts = [(depth, f"Document: {gold_statement}")]
    inserts += [(rng.random(), f"Document: {statement}") for statement, _, _ in facts[1:]]
    prompt_question = f"Answer the question based on the given documents. Question: {question}"
    template = Sample("qa_synthetic", length, index, "", prompt_question, "Answer:", (answer,), MATCH_PART, depth)
    return fill_haystack(template, inserts, rng, haystack, measure)


PASSKEY_INSTRUCTION = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
PASSKEY_QUESTION = "What is the pass key?"
PASSKEY_ANSWER_PREFIX = "The pass key is"


def passkey_needle(key: str) -> str:
    return f"The pass key is {key}. Remember it. {key} is the pass key."


def passkey(length, index, depth, rng, haystack, measure, options) -> Sample:
    """The passkey test of the context-extension papers (Landmark Attention, LongLoRA, YaRN, PoSE).

    Their prompt: an instruction, the filler repeated to the length (the built-in noise haystack is that
    filler), the needle at ``depth``, the question; scored by the first number of the answer.
    """
    key = _number(rng, options.passkey_digits)
    template = Sample(
        "passkey", length, index, "", PASSKEY_QUESTION, PASSKEY_ANSWER_PREFIX, (key,), FIRST_NUMBER, depth
    )
    return fill_haystack(template, [(depth, passkey_needle(key))], rng, haystack, measure, PASSKEY_INSTRUCTION)


TASKS: dict[str, Callable[..., Sample]] = {
    "passkey": passkey,
    "niah_single": niah_single,
    "niah_multikey": niah_multikey,
    "niah_multivalue": niah_multivalue,
    "variable_tracking": variable_tracking,
    "common_words": common_words,
    "qa_synthetic": qa_synthetic,
}

# Tasks whose needle sits at a chosen depth: the ones the depth × length heatmap is made of.
DEPTH_TASKS = ("passkey", "niah_single", "niah_multikey", "niah_multivalue", "qa_synthetic")


def check_task_names(names: Sequence[str]) -> list[str]:
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(unknown)}; valid tasks: {', '.join(TASKS)}")
    return list(names)


def depth_grid(count: int) -> list[float]:
    """``count`` evenly spaced needle depths from 0 (start of the context) to 1 (its end)."""
    if count < 1:
        raise ValueError(f"--depths must be at least 1, got {count}")
    return [0.5] if count == 1 else [i / (count - 1) for i in range(count)]


def generate_samples(
    task: str,
    length: int,
    samples: int,
    measure: Measure,
    haystack: Haystack,
    seed: int = 0,
    depths: Sequence[float] = (0.5,),
    options: TaskOptions | None = None,
) -> list[Sample]:
    """``samples`` samples of ``task`` at ``length`` tokens; depth-bearing tasks cycle through ``depths``.

    Each sample has its own generator seeded from (seed, task, length, index), so adding tasks, lengths
    or samples never changes the samples already there.
    """
    check_task_names([task])
    options = options or TaskOptions()
    out = []
    for index in range(samples):
        rng = random.Random(f"{seed}/{task}/{length}/{index}")
        depth = depths[index % len(depths)]
        out.append(TASKS[task](length, index, depth, rng, haystack, measure, options))
    return out

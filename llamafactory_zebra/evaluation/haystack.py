"""Filler text for the long contexts: RULER's repeated noise sentences, a user's text file, or a dataset.

A dataset is named as in LLaMA-Factory's ``dataset_info.json`` and read through LLaMA-Factory's own
parser of that file; every string in its rows (prompts, responses, messages) becomes haystack text.
Only local files are read: evaluation never downloads.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Encode = Callable[[str], list[int]]

# RULER's "noise" haystack: the same few sentences over and over, so nothing but the needle stands out.
NOISE_SENTENCES = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


class HaystackTooShort(ValueError):
    pass


class Haystack:
    """Sentences to fill a context with, and the token count of each (encoded once, then reused).

    Sentences are taken in order starting at a seeded offset; a built-in haystack cycles, a user's text
    does not (repeating someone's document would make retrieval easier than the user asked for).
    """

    def __init__(self, sentences: Sequence[str], encode: Encode, cycle: bool, source: str) -> None:
        sentences = [s.strip() for s in sentences if s.strip()]
        if not sentences:
            raise HaystackTooShort(f"haystack {source} holds no text")
        self.sentences = sentences
        self.cycle = cycle
        self.source = source
        self.encode = encode
        self.costs = [len(encode(" " + s)) for s in sentences]
        self.total_tokens = sum(self.costs)

    def take(self, budget: int, rng: random.Random) -> list[str]:
        """Consecutive sentences whose token counts sum to at most ``budget``."""
        if not self.cycle and self.total_tokens < budget:
            raise HaystackTooShort(
                f"haystack {self.source} has about {self.total_tokens} tokens, but this length needs {budget} "
                f"of filler; pass a longer text or lower --lengths"
            )
        count = len(self.sentences)
        start = rng.randrange(count) if self.cycle else rng.randrange(max(1, self._last_start(budget) + 1))
        chosen, used, i = [], 0, start
        while True:
            cost = self.costs[i % count]
            if used + cost > budget or (not self.cycle and i >= count):
                return chosen
            chosen.append(self.sentences[i % count])
            used += cost
            i += 1

    def _last_start(self, budget: int) -> int:
        """The latest start from which the remaining text still covers ``budget`` tokens."""
        remaining = 0
        for i in range(len(self.costs) - 1, -1, -1):
            remaining += self.costs[i]
            if remaining >= budget:
                return i
        return 0


def split_sentences(text: str) -> list[str]:
    return [part.strip() for part in _SENTENCE_END.split(text) if part.strip()]


def noise_haystack(encode: Encode) -> Haystack:
    return Haystack(NOISE_SENTENCES, encode, cycle=True, source="noise (built in)")


def file_haystack(path: str | Path, encode: Encode) -> Haystack:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--haystack {path}: no such file")
    return Haystack(split_sentences(path.read_text(encoding="utf-8")), encode, cycle=False, source=str(path))


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list | tuple):
        return [s for item in value for s in _strings(item)]
    return []


def dataset_haystack(name: str, dataset_dir: str | Path, encode: Encode) -> Haystack:
    """Every string of a local dataset registered in ``dataset_dir/dataset_info.json`` under ``name``."""
    from llamafactory.data.parser import get_dataset_list

    attr = get_dataset_list([name], str(dataset_dir))[0]
    if attr.load_from != "file":
        raise ValueError(
            f"--haystack {name}: dataset_info.json in {dataset_dir} points to {attr.load_from} "
            f"({attr.dataset_name}); eval-long reads local files only"
        )
    path = Path(dataset_dir) / attr.dataset_name
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    texts: list[str] = []
    for file in files:
        if file.suffix == ".parquet":
            import pyarrow.parquet as pq

            texts += _strings(pq.read_table(file).to_pylist())
        elif file.suffix == ".jsonl":
            lines = file.read_text(encoding="utf-8").splitlines()
            texts += _strings([json.loads(line) for line in lines if line.strip()])
        elif file.suffix == ".json":
            texts += _strings(json.loads(file.read_text(encoding="utf-8")))
        else:
            texts.append(file.read_text(encoding="utf-8"))
    sentences = [s for text in texts for s in split_sentences(text)]
    return Haystack(sentences, encode, cycle=False, source=f"dataset {name} ({path})")


def load_haystack(spec: str | None, encode: Encode, dataset_dir: str | Path = "data") -> Haystack:
    """``None``/``"noise"``: built in; an existing file: its text; otherwise a dataset_info.json name."""
    if spec in (None, "noise"):
        return noise_haystack(encode)
    if Path(spec).is_file():
        return file_haystack(spec, encode)
    info = Path(dataset_dir) / "dataset_info.json"
    if info.is_file() and spec in json.loads(info.read_text(encoding="utf-8")):
        return dataset_haystack(spec, dataset_dir, encode)
    raise FileNotFoundError(
        f"--haystack {spec!r} is neither a file nor a dataset in {info}; pass a text file, a dataset name "
        f"from dataset_info.json (with --dataset-dir), or 'noise'"
    )

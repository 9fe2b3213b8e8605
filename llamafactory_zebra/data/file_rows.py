"""Find and name the malformed rows of a local dataset file: file, row, line, field, and a valid row.

``datasets`` loads JSON/JSONL through pyarrow, which stops at the first row whose type differs from the
rows before it (``"conversations": "not a list"``) or at a truncated line with a
``DatasetGenerationError`` that names neither the row nor the field. This module re-reads the file the
slow, row-by-row way, only when something already went wrong (a failed load, or rows the converter
guard refused), so a correct dataset costs nothing extra: it reports rows that are not valid JSON,
rows that are not objects, top-level fields whose JSON type differs from the first row that has them,
and rows the dataset's (guarded) converter refuses, each with where it is.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .stages import FEEDBACK, PAIRWISE, PRETRAIN, SUPERVISED

if TYPE_CHECKING:
    from llamafactory.data.parser import DatasetAttr

# What ``datasets`` reads per extension among the formats checked row by row (LLaMA-Factory's FILEEXT2TYPE).
ROW_READERS = ("json", "jsonl", "parquet")
MAX_REPORTED = 10


@dataclass(frozen=True)
class RowProblem:
    file: str
    row: int  # 0-based, in file order
    line: int | None  # 1-based line of the row's start (JSON and JSONL)
    field: str | None
    detail: str

    def describe(self) -> str:
        where = f"row {self.row}" + (f" (line {self.line})" if self.line is not None else "")
        field = f" field '{self.field}':" if self.field else ""
        return f"{os.path.basename(self.file)} {where}:{field} {self.detail}"


class UnreadableRow(Exception):
    def __init__(self, row: int, line: int, detail: str):
        super().__init__(detail)
        self.row, self.line, self.detail = row, line, detail


def local_files(attr: DatasetAttr, dataset_dir: str) -> list[str]:
    """The files LLaMA-Factory's loader reads for a ``file_name`` entry (a file or every file in a folder)."""
    path = os.path.join(dataset_dir, attr.dataset_name)
    if os.path.isdir(path):
        return sorted(os.path.join(path, name) for name in os.listdir(path))
    return [path] if os.path.isfile(path) else []


# A JSON/JSONL file this small may be ``[]`` or whitespace; bigger ones hold at least one row or a syntax error.
_EMPTY_PROBE_BYTES = 64


def why_empty(path: str) -> str | None:
    """Why a data file holds no rows (0 bytes, only whitespace, ``[]``, a 0-row parquet), or ``None``."""
    size = os.path.getsize(path)
    if size == 0:
        return "the file is empty (0 bytes)"
    kind = _extension(path)
    if kind == "parquet":
        import pyarrow.parquet as pq

        return "the parquet file has 0 rows" if pq.ParquetFile(path).metadata.num_rows == 0 else None
    if kind in ("json", "jsonl") and size <= _EMPTY_PROBE_BYTES:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = "".join(f.read().split())
        if text == "":
            return "the file holds only whitespace"
        if text == "[]":
            return "the file holds an empty JSON array []"
    return None


def _extension(path: str) -> str:
    return os.path.splitext(path)[1][1:].lower()


def iter_rows(path: str) -> Iterator[tuple[int, int | None, Any]]:
    """(row, line, value) for each row of a JSON array, JSON-lines or parquet file; raises
    :class:`UnreadableRow` at the first row that is not valid JSON."""
    kind = _extension(path)
    if kind == "parquet":
        import pyarrow.parquet as pq

        row = 0
        for batch in pq.ParquetFile(path).iter_batches():
            for value in batch.to_pylist():
                yield row, None, value
                row += 1
        return
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        yield from _json_array_rows(text)
    else:
        yield from _json_lines_rows(text)


def _json_lines_rows(text: str) -> Iterator[tuple[int, int, Any]]:
    row = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise UnreadableRow(
                row, number, f"not valid JSON: {err.msg} (column {err.colno}); a truncated line?"
            ) from err
        yield row, number, value
        row += 1


def _json_array_rows(text: str) -> Iterator[tuple[int, int, Any]]:
    decoder, row = json.JSONDecoder(), 0
    position, line = text.index("[") + 1, text.count("\n", 0, text.index("[")) + 1
    whitespace = re.compile(r"[\s,]*")
    while True:
        start = whitespace.match(text, position).end()
        line += text.count("\n", position, start)
        if start >= len(text) or text[start] == "]":
            if start >= len(text):
                raise UnreadableRow(row, line, "the JSON array is not closed with ']' (a truncated file?)")
            return
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError as err:
            raise UnreadableRow(
                row, err.lineno, f"not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})"
            ) from err
        yield row, line, value
        line += text.count("\n", start, end)
        position = end
        row += 1


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "list", dict: "object"}.get(type(value), type(value).__name__)


def find_problems(
    files: list[str],
    check_row: Callable[[dict[str, Any]], str],
    messages_column: str | None = None,
    limit: int = MAX_REPORTED,
) -> tuple[list[RowProblem], int]:
    """Up to ``limit`` problems over ``files`` and how many rows had one (reading stops at an unreadable row).

    ``check_row`` returns the converter guard's reason for a row ("" for a good row); ``messages_column``
    (for conversation formats) names the list its "message N" reasons point into.
    """
    problems: list[RowProblem] = []
    bad = 0
    first_type: dict[str, tuple[str, str, int, int | None]] = {}

    def add(problem: RowProblem) -> None:
        nonlocal bad
        bad += 1
        if len(problems) < limit:
            problems.append(problem)

    for path in files:
        if _extension(path) not in ROW_READERS:
            continue
        try:
            for row, line, value in iter_rows(path):
                if not isinstance(value, dict):
                    add(RowProblem(path, row, line, None, f"must be a JSON object, got {_json_type(value)}"))
                    continue
                mixed = _mixed_type(value, path, row, line, first_type)
                if mixed is not None:
                    add(mixed)
                    continue
                reason = check_row(value)
                if reason:
                    add(RowProblem(path, row, line, field_of(reason, messages_column), reason))
        except UnreadableRow as err:
            add(RowProblem(path, err.row, err.line, None, err.detail + "; rows after it were not checked"))
            break
    return problems, bad


def _mixed_type(
    value: dict[str, Any],
    path: str,
    row: int,
    line: int | None,
    first_type: dict[str, tuple[str, str, int, int | None]],
) -> RowProblem | None:
    for column, item in value.items():
        if item is None:
            continue
        kind = _json_type(item)
        seen = first_type.setdefault(column, (kind, path, row, line))
        if seen[0] != kind:
            where = f"row {seen[2]}" + (f" (line {seen[3]})" if seen[3] is not None else "")
            if seen[1] != path:
                where += f" of {os.path.basename(seen[1])}"
            return RowProblem(
                path, row, line, column, f"is a {kind}, but {where} has a {seen[0]}: a column holds one type"
            )
    return None


def field_of(reason: str, messages_column: str | None = None) -> str | None:
    """The column, or ``column[N].key`` inside a conversation, that a converter-guard reason is about."""
    column = re.search(r"column '([^']+)'", reason)
    if column:
        return column.group(1)
    message = re.search(r"message (\d+)(?: has no '([^']+)'| '([^']+)')?", reason)
    if message:
        key = message.group(2) or message.group(3)
        return f"{messages_column or 'messages'}[{message.group(1)}]" + (f".{key}" if key else "")
    return None


def valid_row_example(attr: DatasetAttr, uses_messages: bool, stage: str = SUPERVISED) -> str:
    """One row of the shape this entry's columns and tags map, for the stage being loaded, as JSON."""
    if uses_messages:
        user = attr.user_tag or "user"
        assistant = attr.assistant_tag or "assistant"
        turns = [{attr.role_tag: user, attr.content_tag: "question"}]
        row: dict[str, Any] = {attr.messages: turns}
        if stage == PAIRWISE:
            row[attr.chosen] = {attr.role_tag: assistant, attr.content_tag: "better answer"}
            row[attr.rejected] = {attr.role_tag: assistant, attr.content_tag: "worse answer"}
        else:
            turns.append({attr.role_tag: assistant, attr.content_tag: "answer"})
    elif stage == PRETRAIN:
        return json.dumps({attr.prompt or "text": "document"}, ensure_ascii=False)
    else:
        row = {attr.prompt or "instruction": "question"}
        if attr.query:
            row[attr.query] = "optional input"
        if stage == PAIRWISE:
            row[attr.chosen] = "better answer"
            row[attr.rejected] = "worse answer"
        elif attr.response:
            row[attr.response] = "answer"
    if stage == FEEDBACK and attr.kto_tag:
        row[attr.kto_tag] = True
    if attr.system and stage != PRETRAIN:
        row[attr.system] = "optional system prompt"
    return json.dumps(row, ensure_ascii=False)

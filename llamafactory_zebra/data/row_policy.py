"""What happens to malformed rows before training: an error that names them, or an explicit, counted skip.

LLaMA-Factory either fails inside ``datasets`` (pyarrow's ``DatasetGenerationError``, no row, no field)
or drops rows with a generic warning. Here a dataset with malformed rows stops the run before
tokenisation with every location that matters (dataset, file, row, line, field, what is wrong) and a
valid row of the entry's shape. A dataset entry can opt into training without them with
``"skip_invalid_rows": true`` in ``dataset_info.json`` (the recipe's registry entries do: public
datasets of that size hold rows the recipe filters by design, e.g. unfinished reasoning traces); the
log then says how many rows were skipped and which.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .file_rows import find_problems, local_files, valid_row_example, why_empty
from .registry import SKIP_KEY
from .validation import DROP_REASON_COLUMN, GuardedConverter, dataset_label, split_reason

if TYPE_CHECKING:
    from llamafactory.data.parser import DatasetAttr

SKIP_ATTRIBUTE = "zebra_skip_invalid_rows"
# Set by ``data inspect``: every refused row stays in the converted dataset as a placeholder for the report.
REPORT_ATTRIBUTE = "zebra_report_refused_rows"
ROWS_LISTED = 20


class MalformedDataError(ValueError):
    """A dataset has rows that cannot train; the message says where and what a valid row looks like."""


class EmptyDataError(MalformedDataError):
    """A dataset file (or folder) holds no rows; the message names the dataset and the file."""


def skips_invalid_rows(attr: DatasetAttr) -> bool:
    return bool(getattr(attr, SKIP_ATTRIBUTE, False))


def _scan_check(converter: GuardedConverter):
    """The converter guard's verdict on a raw row; columns a JSON-lines row leaves out read as null, as in
    the Arrow table ``datasets`` builds."""
    columns = converter.required_columns()

    def check(row: dict[str, Any]) -> str:
        return converter.reason({**dict.fromkeys(columns), **row})

    return check


def malformed_rows_message(attr: DatasetAttr, dataset_dir: str, converter: GuardedConverter, cause: str) -> str | None:
    """The error for a local dataset whose files hold malformed rows, or ``None`` if none is found.
    ``cause`` is "load" (``datasets`` could not read the file) or "refused" (the converter guard refused rows)."""
    files = local_files(attr, dataset_dir)
    messages = attr.messages if converter.uses_messages else None
    problems, bad = find_problems(files, _scan_check(converter), messages)
    if not problems:
        return None
    label = dataset_label(attr)
    shown = "\n".join(f"  - {problem.describe()}" for problem in problems)
    more = f"\n  ... and {bad - len(problems)} more" if bad > len(problems) else ""
    where = files[0] if len(files) == 1 else f"{len(files)} files in {attr.dataset_name}"
    fix = "Fix these rows"
    if cause == "refused":
        fix += f", or add \"{SKIP_KEY}\": true to the '{label}' entry of dataset_info.json to train without them"
    return (
        f"Dataset '{label}' ({where}, formatting {attr.formatting}): {bad} malformed row(s)"
        f"{' — the file could not be loaded' if cause == 'load' else ''}:\n{shown}{more}\n"
        f"A valid row of this entry looks like:\n  {valid_row_example(attr, converter.uses_messages, converter.stage)}"
        f"\n{fix}."
    )


def check_converted_rows(
    dataset: Any, attr: DatasetAttr, dataset_dir: str, converter: GuardedConverter, logger: Any
) -> Any:
    """The dataset without the rows the converter guard refused, and without the guard's drop-reason column:
    raise for them, or log them (count and row indices) and leave them out when the entry skips. Streamed
    rows are seen only during training (``data inspect`` reads them ahead): the guard's warning names the
    first of each kind, and they are left out. For ``data inspect`` (``REPORT_ATTRIBUTE``) the placeholders
    and the column stay, to be counted.

    Left in, a refused row's placeholder would still reach the processors that do not skip it: pre-training
    would train on its empty text, and KTO pairs each row with its neighbour's response.
    """
    from datasets import Dataset, IterableDataset

    reporting = bool(getattr(attr, REPORT_ATTRIBUTE, False))
    if isinstance(dataset, IterableDataset):
        if reporting or DROP_REASON_COLUMN not in (dataset.column_names or [DROP_REASON_COLUMN]):
            return dataset  # (a streamed map's columns may be unknown: then the column is there)
        kept = dataset.filter(lambda reason: not reason, input_columns=[DROP_REASON_COLUMN])
        return kept.remove_columns(DROP_REASON_COLUMN)
    if not isinstance(dataset, Dataset) or DROP_REASON_COLUMN not in dataset.column_names:
        return dataset
    reasons = dataset[DROP_REASON_COLUMN]
    refused = [(index, reason) for index, reason in enumerate(reasons) if reason]
    if refused and not (skips_invalid_rows(attr) or reporting):
        raise MalformedDataError(_refused_rows_message(dataset, attr, dataset_dir, converter, refused))
    if refused:
        rows_by_kind: dict[str, list[int]] = defaultdict(list)
        for index, reason in refused:
            rows_by_kind[split_reason(reason)[0]].append(index)
        listed = "; ".join(
            f"{kind} x{len(rows)}: rows {', '.join(map(str, rows[:ROWS_LISTED]))}"
            f"{' ...' if len(rows) > ROWS_LISTED else ''}"
            for kind, rows in rows_by_kind.items()
        )
        logger.warning_rank0(
            f"llamafactory-zebra: dataset '{dataset_label(attr)}': skipping {len(refused)} of {len(dataset)} rows "
            f"({SKIP_KEY}): {listed}. `llamafactory-zebra data inspect` shows each reason."
        )
    if reporting:
        return dataset
    if refused:
        dataset = dataset.select([index for index, reason in enumerate(reasons) if not reason])
    return dataset.remove_columns(DROP_REASON_COLUMN)


def _refused_rows_message(
    dataset: Any, attr: DatasetAttr, dataset_dir: str, converter: GuardedConverter, refused: list[tuple[int, str]]
) -> str:
    """The error for refused rows: by file, row and line when the files show them, else by loaded index (hub
    data, or rows only a sampled subset shows)."""
    if attr.load_from == "file":
        message = malformed_rows_message(attr, dataset_dir, replace(converter, quiet=True), "refused")
        if message is not None:
            return message
    label = dataset_label(attr)
    shown = "\n".join(f"  - loaded row {index}: {reason}" for index, reason in refused[:ROWS_LISTED])
    example = valid_row_example(attr, converter.uses_messages, converter.stage)
    return (
        f"Dataset '{label}' ({attr.dataset_name}): {len(refused)} of {len(dataset)} loaded rows are malformed:\n"
        f"{shown}\nA valid row of this entry looks like:\n  {example}\n"
        f"Fix the data, or add \"{SKIP_KEY}\": true to the '{label}' entry of dataset_info.json to train "
        "without them."
    )


def empty_files_message(attr: DatasetAttr, dataset_dir: str, converter: GuardedConverter) -> str | None:
    """The error for a local dataset with an empty file (or an empty folder), or ``None``.

    Upstream fails on these with ``datasets``' "An error occurred while generating the dataset" or
    'Instruction "train" corresponds to no data!' (an empty folder: an ``IndexError``), naming no file.
    """
    path = os.path.join(dataset_dir, attr.dataset_name)
    files = local_files(attr, dataset_dir)
    if os.path.isdir(path) and not files:
        empty = [f"{path}: the folder holds no files"]
    else:
        empty = [f"{file}: {why}" for file in files if (why := why_empty(file)) is not None]
    if not empty:
        return None
    shown = "\n".join(f"  - {line}" for line in empty)
    example = valid_row_example(attr, converter.uses_messages, converter.stage)
    return (
        f"Dataset '{dataset_label(attr)}' has no rows to train on:\n{shown}\n"
        f"Each file needs at least one row; a valid row of this entry looks like:\n  {example}"
    )

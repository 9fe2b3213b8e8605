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

from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .file_rows import find_problems, local_files, valid_row_example
from .registry import SKIP_KEY
from .validation import DROP_REASON_COLUMN, GuardedConverter, dataset_label, split_reason

if TYPE_CHECKING:
    from llamafactory.data.parser import DatasetAttr

SKIP_ATTRIBUTE = "zebra_skip_invalid_rows"
ROWS_LISTED = 20


class MalformedDataError(ValueError):
    """A dataset has rows that cannot train; the message says where and what a valid row looks like."""


def skips_invalid_rows(attr: DatasetAttr) -> bool:
    return bool(getattr(attr, SKIP_ATTRIBUTE, False))


def _scan_check(converter: GuardedConverter):
    """The converter guard's verdict on a raw row; columns a JSON-lines row leaves out read as null, as in
    the Arrow table ``datasets`` builds."""
    columns = converter.required_columns()

    def check(row: dict[str, Any]) -> str:
        return converter({**dict.fromkeys(columns), **row})[DROP_REASON_COLUMN]

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
        f"A valid row of this entry looks like:\n  {valid_row_example(attr, converter.uses_messages)}\n{fix}."
    )


def check_converted_rows(
    dataset: Any, attr: DatasetAttr, dataset_dir: str, converter: GuardedConverter, logger: Any
) -> None:
    """Raise for rows the converter guard refused, or log them (count and row indices) when the entry skips."""
    from datasets import Dataset

    if not isinstance(dataset, Dataset) or DROP_REASON_COLUMN not in dataset.column_names:
        return  # streamed rows are seen only during training; `data inspect` reads them ahead
    refused = [(index, reason) for index, reason in enumerate(dataset[DROP_REASON_COLUMN]) if reason]
    if not refused:
        return
    label = dataset_label(attr)
    if skips_invalid_rows(attr):
        rows_by_kind: dict[str, list[int]] = defaultdict(list)
        for index, reason in refused:
            rows_by_kind[split_reason(reason)[0]].append(index)
        listed = "; ".join(
            f"{kind} x{len(rows)}: rows {', '.join(map(str, rows[:ROWS_LISTED]))}{' ...' if len(rows) > ROWS_LISTED else ''}"
            for kind, rows in rows_by_kind.items()
        )
        logger.warning_rank0(
            f"llamafactory-zebra: dataset '{label}': skipping {len(refused)} of {len(dataset)} rows ({SKIP_KEY}): "
            f"{listed}. `llamafactory-zebra data inspect` shows each reason."
        )
        return
    message = None
    if attr.load_from == "file":
        message = malformed_rows_message(attr, dataset_dir, replace(converter, quiet=True), "refused")
    if message is None:  # hub data, or rows only a sampled subset shows: name them by their loaded index
        shown = "\n".join(f"  - loaded row {index}: {reason}" for index, reason in refused[:ROWS_LISTED])
        message = (
            f"Dataset '{label}' ({attr.dataset_name}): {len(refused)} of {len(dataset)} loaded rows are malformed:\n"
            f"{shown}\nA valid row of this entry looks like:\n  {valid_row_example(attr, converter.uses_messages)}\n"
            f"Fix the data, or add \"{SKIP_KEY}\": true to the '{label}' entry of dataset_info.json to train "
            "without them."
        )
    raise MalformedDataError(message)

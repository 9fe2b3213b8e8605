"""Row checks that turn malformed data into a named drop or a clear error, never a bare KeyError.

LLaMA-Factory's converters index rows directly (``example[column]``) and skip some bad rows with
a generic "Invalid role tag" warning, so a dataset with a missing column fails deep inside
``datasets.map`` and a broken row vanishes without a reason. Every converter (LLaMA-Factory's and
ours) runs behind :class:`GuardedConverter`: a dataset whose mapped column is absent raises a
``ValueError`` naming the dataset, the column and the columns present; a bad row becomes a
placeholder example that every processor skips. The converter's rows hold LLaMA-Factory's keys and no
others, for every model: the reasons travel in a ``_zebra_drop_reason`` column only while the loader seam
loads a dataset (:func:`collecting_drop_reasons`), and that seam removes the column again after reading it
(``data inspect`` counts them per reason with row indices). Rows are
checked for the stage being loaded (``stages.py``): pre-training text, SFT answers, preference pairs,
KTO tags; a row the stage's processor would skip or crash on is such a drop. After conversion the loader seam
(``integration/datasets.py``) turns any such row into an error naming file, row and field, unless the
dataset's entry says ``"skip_invalid_rows": true`` (then it logs how many rows and which, and removes
them before any processor sees them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .stages import FEEDBACK, PAIRWISE, PRETRAIN, SUPERVISED, UNSUPERVISED, processor_refusal, stage_for

if TYPE_CHECKING:
    from llamafactory.data.converter import DatasetConverter
    from llamafactory.data.parser import DatasetAttr

logger = logging.getLogger(__name__)

DROP_REASON_COLUMN = "_zebra_drop_reason"
_COLLECTING_REASONS: ContextVar[bool] = ContextVar("zebra_collecting_drop_reasons", default=False)
_MEDIA_FIELDS = ("images", "videos", "audios")
# DatasetAttr fields each stock converter reads with ``example[...]`` (absent column -> KeyError upstream).
_STOCK_FIELDS = {
    "alpaca": ("prompt", "query", "response", "history", "system", "tools"),
    "sharegpt": ("messages", "system", "tools"),
    "openai": ("messages",),
}


class DropRow(Exception):
    """Raised by row checks; ``kind`` groups drops in reports, ``detail`` says what is wrong."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


class MissingColumnError(ValueError):
    """A column mapped in dataset_info.json is absent from the data: a dataset-level error, not a row's."""


def split_reason(reason: str) -> tuple[str, str]:
    kind, _, detail = reason.partition(": ")
    return kind, detail


def dataset_label(attr: DatasetAttr) -> str:
    """The name the user wrote in ``dataset:`` when known (set by the parser seam), else the hub id/file."""
    return getattr(attr, "zebra_name", None) or attr.dataset_name


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def required_fields(attr: DatasetAttr, converter_fields: tuple[str, ...]) -> tuple[str, ...]:
    """DatasetAttr fields whose mapped column must exist for this dataset."""
    fields = list(converter_fields) + list(_MEDIA_FIELDS) + ["kto_tag"]
    if attr.ranking:
        fields += ["chosen", "rejected"]
    return tuple(name for name in dict.fromkeys(fields) if getattr(attr, name, None))


def check_columns(example: dict[str, Any], attr: DatasetAttr, fields: tuple[str, ...]) -> None:
    missing = [(name, getattr(attr, name)) for name in fields if getattr(attr, name) not in example]
    if missing:
        wanted = ", ".join(f"'{column}' (columns.{name})" for name, column in missing)
        raise MissingColumnError(
            f"Dataset '{dataset_label(attr)}': column {wanted} not found; the data has columns "
            f'{sorted(example)}. Map the right column in its dataset_info.json entry under "columns", '
            "or set the field to null if the data has no such column."
        )


def optional_text(example: dict[str, Any], column: str | None, what: str) -> str:
    """A string column that may be null or absent from the mapping; anything else is a wrong type."""
    if not column:
        return ""
    value = example.get(column)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DropRow("wrong type", f"{what} column '{column}' must be a string, got {_type_name(value)}")
    return value


def required_text(value: Any, what: str, empty_kind: str) -> str:
    """A non-empty string (after stripping whitespace); ``empty_kind`` names the drop when it is blank."""
    if value is None:
        raise DropRow("missing value", f"{what} is null")
    if not isinstance(value, str):
        raise DropRow("wrong type", f"{what} must be a string, got {_type_name(value)}")
    if not value.strip():
        raise DropRow(empty_kind, f"{what} is empty")
    return value


def read_conversation(
    example: dict[str, Any], attr: DatasetAttr, ends_with_prompt: bool = False, require_answers: bool = True
) -> tuple[str, list[tuple[str, str]]]:
    """Checks a list-of-messages column and returns (system, [(role tag, content), ...]).

    Follows LLaMA-Factory's sharegpt rules: an optional leading system message, then user-side
    tags (user, observation) on even turns and assistant-side tags (assistant, function) on odd
    turns, ending with an assistant-side turn (a preference row's conversation, ``ends_with_prompt``,
    ends with a user-side turn: its answers are the chosen/rejected columns). With ``require_answers``
    no assistant-side turn may be empty.
    """
    column = attr.messages
    messages = example.get(column)
    if messages is None:
        raise DropRow("missing value", f"messages column '{column}' is null")
    if not isinstance(messages, list):
        raise DropRow("wrong type", f"messages column '{column}' must be a list, got {_type_name(messages)}")
    turns: list[tuple[str, str]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise DropRow("wrong type", f"message {index} must be an object, got {_type_name(message)}")
        role, content = message.get(attr.role_tag), message.get(attr.content_tag)
        if role is None:
            raise DropRow("missing value", f"message {index} has no '{attr.role_tag}'")
        if not isinstance(content, str):
            raise DropRow(
                "wrong type", f"message {index} '{attr.content_tag}' must be a string, got {_type_name(content)}"
            )
        turns.append((role, content))

    system = optional_text(example, attr.system, "system")
    if turns and attr.system_tag and turns[0][0] == attr.system_tag:
        system = turns[0][1]
        turns = turns[1:]
    if not turns:
        raise DropRow("empty conversation", f"messages column '{column}' has no user/assistant turns")

    offset = len(messages) - len(turns)
    for index, (role, _) in enumerate(turns):
        expected = _side_tags(attr, answer=bool(index % 2))
        if role not in expected:
            raise DropRow(
                "broken role order", f"message {index + offset} has role {role!r}, expected one of {list(expected)}"
            )
    if ends_with_prompt and not len(turns) % 2:
        raise DropRow(
            "broken role order",
            f"messages column '{column}' ends with a {turns[-1][0]!r} turn; a preference row's conversation ends with "
            "the prompt, and its answers are the chosen/rejected columns",
        )
    if not ends_with_prompt and len(turns) % 2:
        raise DropRow(
            "broken role order", f"messages column '{column}' ends with a {turns[-1][0]!r} turn, not an answer"
        )
    for index in range(1, len(turns), 2) if require_answers else ():
        if not turns[index][1].strip():
            raise DropRow("empty response", f"message {index + offset} ({turns[index][0]!r}) is empty")
    return system, turns


def _side_tags(attr: DatasetAttr, answer: bool) -> tuple[str, ...]:
    """The role tags LLaMA-Factory accepts on the user side (user, observation) or the answer side (assistant,
    function)."""
    tags = (attr.assistant_tag, attr.function_tag) if answer else (attr.user_tag, attr.observation_tag)
    return tuple(tag for tag in tags if tag)


def check_kto_tag(example: dict[str, Any], attr: DatasetAttr) -> None:
    """Upstream reads a non-boolean tag as "no tag" and makes the row an SFT row, which KTO then drops."""
    value = example.get(attr.kto_tag)
    if not isinstance(value, bool):
        kind = "missing value" if value is None else "wrong type"
        raise DropRow(kind, f"kto_tag column '{attr.kto_tag}' must be true or false, got {_type_name(value)}")


def check_preference_answers(example: dict[str, Any], attr: DatasetAttr, as_messages: bool) -> None:
    """Chosen and rejected answers: strings (alpaca) or one assistant-side message each (sharegpt/openai).

    Upstream turns a wrong-typed pair into a row the pairwise processor drops, and trains on a message whose
    role is not an assistant-side tag after only a warning.
    """
    for name in ("chosen", "rejected"):
        column = getattr(attr, name)
        value = example.get(column)
        what = f"{name} column '{column}'"
        if not as_messages:
            required_text(value, what, "empty response")
            continue
        if not isinstance(value, dict):
            kind = "missing value" if value is None else "wrong type"
            raise DropRow(kind, f"{what} must be one message object, got {_type_name(value)}")
        expected = _side_tags(attr, answer=True)
        if value.get(attr.role_tag) not in expected:
            raise DropRow(
                "broken role order",
                f"{what} has role {value.get(attr.role_tag)!r} in '{attr.role_tag}', expected one of {list(expected)}",
            )
        required_text(value.get(attr.content_tag), f"{what} '{attr.content_tag}'", "empty response")


def check_alpaca_row(example: dict[str, Any], attr: DatasetAttr, stage: str = SUPERVISED) -> None:
    instruction = optional_text(example, attr.prompt, "prompt") + optional_text(example, attr.query, "query")
    if not instruction.strip():
        columns = " and ".join(f"'{column}'" for column in (attr.prompt, attr.query) if column)
        raise DropRow("empty text", f"prompt column {columns} is empty")
    optional_text(example, attr.system, "system")
    history = example.get(attr.history) if attr.history else None
    if history is not None and (
        not isinstance(history, list)
        or not all(
            isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(text, str) for text in pair)
            for pair in history
        )
    ):
        raise DropRow("wrong type", f"history column '{attr.history}' must be a list of [prompt, response] pairs")
    if stage == PRETRAIN:
        if history:  # the pre-training processor reads the first prompt turn only: history[0][0]
            raise DropRow(
                "unused text", f"history column '{attr.history}': pre-training would train on its first prompt only"
            )
        return
    if stage == PAIRWISE:
        check_preference_answers(example, attr, as_messages=False)
        return
    if stage == FEEDBACK:
        check_kto_tag(example, attr)
    if attr.response and stage != UNSUPERVISED:  # prediction sets map no response column
        required_text(example.get(attr.response), f"response column '{attr.response}'", "empty response")
    elif attr.response:
        optional_text(example, attr.response, "response")


def check_openai_row(example: dict[str, Any], attr: DatasetAttr, stage: str = SUPERVISED) -> None:
    """Type checks only: tool calls and tool results change the turn order, LLaMA-Factory checks that."""
    messages = example.get(attr.messages)
    if messages is None:
        raise DropRow("missing value", f"messages column '{attr.messages}' is null")
    if not isinstance(messages, list):
        raise DropRow("wrong type", f"messages column '{attr.messages}' must be a list, got {_type_name(messages)}")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get(attr.role_tag) is None:
            raise DropRow("missing value", f"message {index} has no '{attr.role_tag}'")
    if stage == PAIRWISE:
        check_preference_answers(example, attr, as_messages=True)
    elif stage == FEEDBACK:
        check_kto_tag(example, attr)


def check_sharegpt_row(example: dict[str, Any], attr: DatasetAttr, stage: str = SUPERVISED) -> None:
    _, turns = read_conversation(
        example, attr, ends_with_prompt=stage == PAIRWISE, require_answers=stage in (SUPERVISED, FEEDBACK)
    )
    if stage == PRETRAIN and not turns[0][1].strip():
        raise DropRow(
            "empty text", f"messages column '{attr.messages}': the first turn, the text pre-trained on, is empty"
        )
    if stage == PAIRWISE:
        check_preference_answers(example, attr, as_messages=True)
    elif stage == FEEDBACK:
        check_kto_tag(example, attr)


_STOCK_ROW_CHECKS = {"alpaca": check_alpaca_row, "sharegpt": check_sharegpt_row, "openai": check_openai_row}


def placeholder_example() -> dict[str, Any]:
    """The aligned form of a dropped row, with LLaMA-Factory's aligned keys only.

    An even number of prompt turns makes every LLaMA-Factory processor that checks turns (SFT,
    pairwise, KTO, prediction) skip the row. The turns are real (empty) messages rather than empty
    lists: ``datasets`` fixes a column's Arrow type from the first written batch, and a batch of
    only ``[]`` would type ``_prompt`` as list<null> and fail on the first real conversation.
    """
    placeholder = [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]
    return {
        "_prompt": placeholder,
        "_response": placeholder[1:],
        "_system": "",
        "_tools": "",
        "_images": None,
        "_videos": None,
        "_audios": None,
    }


@contextmanager
def collecting_drop_reasons() -> Iterator[None]:
    """Converters handed out inside this block add :data:`DROP_REASON_COLUMN` to each row ("" for a kept row).

    Only the loader seam opens it, around one dataset's load, and it removes the column from the loaded
    dataset (``row_policy.check_converted_rows``): a column is the one channel that comes back from
    ``datasets.map`` worker processes, and outside the block a converter's rows are exactly stock.
    """
    token = _COLLECTING_REASONS.set(True)
    try:
        yield
    finally:
        _COLLECTING_REASONS.reset(token)


def collects_drop_reasons() -> bool:
    return _COLLECTING_REASONS.get()


def _plugin_version() -> str:
    from .. import __version__

    return __version__


@dataclass
class GuardedConverter:
    """Wraps one dataset's converter: schema errors raise, bad rows become counted drops.

    ``stage`` is the LLaMA-Factory stage whose processor consumes the rows (recorded by the loader seam,
    see ``stages.py``): a row is checked for that processor, and a row it would skip or crash on is a drop.
    ``with_reasons`` (set for converters made inside :func:`collecting_drop_reasons`) adds each row's drop
    reason as :data:`DROP_REASON_COLUMN`; without it a row holds LLaMA-Factory's aligned keys only.
    ``plugin_version``, ``stage`` and ``with_reasons`` are part of the pickled state that ``datasets`` hashes
    into its cache key (classes themselves are hashed by name), so an upgraded plugin, another stage or the
    other column set does not reuse stale conversions.
    """

    converter: DatasetConverter
    formatting: str
    quiet: bool = False
    stage: str | None = None
    with_reasons: bool = False
    plugin_version: str = field(default_factory=_plugin_version)
    _warned: set[str] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if self.stage is None:
            self.stage = stage_for(self.attr)

    @property
    def attr(self) -> DatasetAttr:
        return self.converter.dataset_attr

    def _fields(self) -> tuple[str, ...]:
        own = getattr(self.converter, "required_fields", None)
        fields = required_fields(self.attr, own if own is not None else _STOCK_FIELDS.get(self.formatting, ()))
        if self.stage == PAIRWISE and own is None:  # upstream reads the response column only without a pair
            fields = tuple(name for name in fields if name != "response")
        return fields

    @property
    def uses_messages(self) -> bool:
        return "messages" in self._fields()

    def required_columns(self) -> tuple[str, ...]:
        return tuple(getattr(self.attr, name) for name in self._fields())

    def convert(self, example: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """The aligned row and its drop reason ("" when kept; a placeholder row when dropped).

        Raises :class:`MissingColumnError` when a mapped column is absent: a dataset's error, not a row's.
        """
        check_columns(example, self.attr, self._fields())
        try:
            check_row = _STOCK_ROW_CHECKS.get(self.formatting)
            if check_row is not None:
                check_row(example, self.attr, self.stage)
            output = self.converter(example)
        except DropRow as drop:
            return self._drop(drop.kind, drop.detail)
        except (KeyError, TypeError, AttributeError, IndexError, ValueError) as err:
            return self._drop("malformed row", f"{self.formatting} converter raised {type(err).__name__}: {err}")
        refusal = processor_refusal(output, self.stage)
        if refusal is not None:
            kind, detail = refusal
            return self._drop(kind, f"LLaMA-Factory's {self.formatting} converter: {detail}")
        return output, ""

    def reason(self, example: dict[str, Any]) -> str:
        """Why this row is dropped, or "" when it is kept."""
        return self.convert(example)[1]

    def __call__(self, example: dict[str, Any]) -> dict[str, Any]:
        output, reason = self.convert(example)
        return {**output, DROP_REASON_COLUMN: reason} if self.with_reasons else output

    def _drop(self, kind: str, detail: str) -> tuple[dict[str, Any], str]:
        if kind not in self._warned and not self.quiet:
            self._warned.add(kind)
            logger.warning(
                "Dataset '%s': dropping rows with %s (first: %s). `llamafactory-zebra data inspect` lists them all.",
                dataset_label(self.attr),
                kind,
                detail,
            )
        return placeholder_example(), f"{kind}: {detail}"

"""Malformed rows in a user's dataset file stop ``get_dataset`` before tokenisation, named by file, row,
line and field with a valid row to copy; ``skip_invalid_rows`` trains without them and says which."""

import json

import pytest
from llamafactory_data import load_with_llamafactory

from llamafactory_zebra.data.row_policy import MalformedDataError

pytestmark = pytest.mark.usefixtures("dataset_seams")

SHAREGPT = {"formatting": "sharegpt", "columns": {"messages": "conversations"}}
ALPACA = {"formatting": "alpaca"}
VALID_SHAREGPT = '{"conversations": [{"from": "human", "value": "question"}, {"from": "gpt", "value": "answer"}]}'
VALID_ALPACA = '{"instruction": "question", "input": "optional input", "output": "answer"}'


def _turns(*pairs):
    return [{"from": role, "value": text} for role, text in pairs]


GOOD = {"conversations": _turns(("human", "hi"), ("gpt", "hello"))}


def _write_lines(path, rows):
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))


def _load(tmp_path, tokenizer_dir, file_name, entry, name="mine"):
    (tmp_path / "dataset_info.json").write_text(json.dumps({name: {"file_name": file_name, **entry}}))
    values = {
        "model_name_or_path": str(tokenizer_dir),
        "dataset": name,
        "dataset_dir": str(tmp_path),
        "template": "qwen3",
        "cutoff_len": 64,
        "output_dir": str(tmp_path / "out"),
    }
    return load_with_llamafactory(values, "sft")[0]


def _error(tmp_path, tokenizer_dir, file_name, entry):
    with pytest.raises(MalformedDataError) as raised:
        _load(tmp_path, tokenizer_dir, file_name, entry)
    return str(raised.value)


def test_mixed_type_rows_name_the_row_and_field_instead_of_pyarrows_error(tmp_path, tiny_tokenizer_dir):
    _write_lines(tmp_path / "chat.jsonl", [GOOD, GOOD, {"conversations": "not a list"}, GOOD])
    message = _error(tmp_path, tiny_tokenizer_dir, "chat.jsonl", SHAREGPT)
    assert message.startswith(f"Dataset 'mine' ({tmp_path / 'chat.jsonl'}, formatting sharegpt): 1 malformed row(s)")
    assert "chat.jsonl row 2 (line 3): field 'conversations': is a string, but row 0 (line 1) has a list" in message
    assert VALID_SHAREGPT in message


def test_missing_role_and_empty_conversation_name_their_rows_and_offer_the_skip(tmp_path, tiny_tokenizer_dir):
    rows = [
        GOOD,
        {"conversations": [{"value": "no role"}, {"from": "gpt", "value": "x"}]},
        {"conversations": []},
        GOOD,
    ]
    (tmp_path / "chat.json").write_text(json.dumps(rows, indent=1))
    message = _error(tmp_path, tiny_tokenizer_dir, "chat.json", SHAREGPT)
    assert message.startswith(f"Dataset 'mine' ({tmp_path / 'chat.json'}, formatting sharegpt): 2 malformed row(s):")
    assert (
        "chat.json row 1 (line 14): field 'conversations[0].from': missing value: message 0 has no 'from'" in message
    )
    assert "chat.json row 2 (line 25): field 'conversations': empty conversation" in message
    assert VALID_SHAREGPT in message and '"skip_invalid_rows": true' in message


@pytest.mark.parametrize(
    "row,field",
    [
        ({"instruction": "b", "input": "", "output": 5}, "output"),
        ({"instruction": ["b"], "input": "", "output": "y"}, "instruction"),
    ],
)
def test_non_string_value_names_row_and_field(tmp_path, tiny_tokenizer_dir, row, field):
    rows = [{"instruction": "a", "input": "", "output": "x"}, row]
    (tmp_path / "data.json").write_text(json.dumps(rows))
    message = _error(tmp_path, tiny_tokenizer_dir, "data.json", ALPACA)
    assert f"data.json row 1 (line 1): field '{field}': is a " in message and VALID_ALPACA in message


def test_non_string_message_value_inside_a_conversation(tmp_path, tiny_tokenizer_dir):
    _write_lines(
        tmp_path / "chat.jsonl", [GOOD, {"conversations": _turns(("human", "q")) + [{"from": "gpt", "value": 5}]}]
    )
    message = _error(tmp_path, tiny_tokenizer_dir, "chat.jsonl", SHAREGPT)
    assert (
        "chat.jsonl row 1 (line 2): field 'conversations[1].value': wrong type: message 1 'value' must be" in message
    )


def test_truncated_jsonl_line_is_named(tmp_path, tiny_tokenizer_dir):
    _write_lines(tmp_path / "chat.jsonl", [GOOD, GOOD, json.dumps(GOOD)[:25]])
    message = _error(tmp_path, tiny_tokenizer_dir, "chat.jsonl", SHAREGPT)
    assert "chat.jsonl row 2 (line 3): not valid JSON: Unterminated string" in message and "truncated" in message


def test_alpaca_parquet_row_with_a_non_string_and_an_empty_output(tmp_path, tiny_tokenizer_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"instruction": ["a", "b", "c"], "input": ["", "", ""], "output": ["x", "", "z"]})
    pq.write_table(table, tmp_path / "data.parquet")
    message = _error(tmp_path, tiny_tokenizer_dir, "data.parquet", ALPACA)
    assert "data.parquet row 1: field 'output': empty response" in message
    assert VALID_ALPACA in message


def test_skip_invalid_rows_trains_without_them_and_says_which(tmp_path, tiny_tokenizer_dir, monkeypatch):
    import llamafactory.data.loader as loader

    warnings = []
    monkeypatch.setattr(loader.logger, "warning_rank0", warnings.append)
    _write_lines(
        tmp_path / "chat.jsonl", [GOOD, {"conversations": []}, GOOD, {"conversations": _turns(("human", "q"))}]
    )
    dataset = _load(tmp_path, tiny_tokenizer_dir, "chat.jsonl", {**SHAREGPT, "skip_invalid_rows": True})
    assert len(dataset["train_dataset"]) == 2
    (warning,) = [w for w in warnings if "skipping" in w]
    assert "dataset 'mine': skipping 2 of 4 rows (skip_invalid_rows)" in warning
    assert "empty conversation x1: rows 1" in warning and "broken role order x1: rows 3" in warning

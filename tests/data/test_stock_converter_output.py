"""With the plugin active, LLaMA-Factory's converters and loaded datasets hold LLaMA-Factory's keys only.

The first two tests are LLaMA-Factory 0.9.5's own ``tests/data/test_converter.py`` (same rows, same expected
dicts), run here with the plugin's row guard installed; they also compare with the unwrapped upstream converter.
The loader tests show the guard's drop reasons still reach the user while the loaded rows stay stock.
"""

import json

import llamafactory.data.converter as converter_module
import pytest
from llamafactory.data import Role
from llamafactory.data.parser import DatasetAttr
from llamafactory.hparams import DataArguments
from llamafactory_data import load_with_llamafactory

from llamafactory_zebra.data.validation import GuardedConverter
from llamafactory_zebra.seam import ORIGINAL

pytestmark = pytest.mark.usefixtures("dataset_seams")

STOCK_KEYS = ["_prompt", "_response", "_system", "_tools", "_images", "_videos", "_audios"]
ALPACA_ROW = {"instruction": "Solve the math problem.", "input": "3 + 4", "output": "The answer is 7."}
SHAREGPT_ROW = {
    "conversations": [
        {"from": "system", "value": "You are a helpful assistant."},
        {"from": "human", "value": "Solve the math problem.\n3 + 4"},
        {"from": "gpt", "value": "The answer is 7."},
    ]
}


def _expected(system: str) -> dict:
    return {
        "_prompt": [{"role": Role.USER.value, "content": "Solve the math problem.\n3 + 4"}],
        "_response": [{"role": Role.ASSISTANT.value, "content": "The answer is 7."}],
        "_system": system,
        "_tools": "",
        "_images": None,
        "_videos": None,
        "_audios": None,
    }


@pytest.mark.parametrize(
    ("formatting", "row", "system"),
    [("alpaca", ALPACA_ROW, ""), ("sharegpt", SHAREGPT_ROW, "You are a helpful assistant.")],
)
def test_llamafactory_converter_tests_pass_with_the_plugin(formatting, row, system):
    dataset_attr = DatasetAttr("hf_hub", "llamafactory/tiny-supervised-dataset")
    data_args = DataArguments()
    get_converter = converter_module.get_dataset_converter
    converter = get_converter(formatting, dataset_attr, data_args)
    assert isinstance(converter, GuardedConverter)  # the guard is active, and still leaves the keys alone
    assert converter(row) == _expected(system)
    assert converter(row) == getattr(get_converter, ORIGINAL)(formatting, dataset_attr, data_args)(row)


def test_a_dropped_row_is_a_stock_placeholder_outside_the_loader():
    converter = converter_module.get_dataset_converter("sharegpt", DatasetAttr("file", "x.json"), DataArguments())
    dropped = {"conversations": [{"from": "human", "value": "no answer"}]}
    assert list(converter(dropped)) == STOCK_KEYS
    assert converter.reason(dropped) == (
        "broken role order: messages column 'conversations' ends with a 'human' turn, not an answer"
    )


def _write(tmp_path, rows, entry):
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"mine": {"file_name": "chat.jsonl", **entry}}))


def _single_dataset(tmp_path, tokenizer_dir, streaming=False):
    """One dataset through LLaMA-Factory's (seam-wrapped) ``_load_single_dataset``, as ``get_dataset`` calls it."""
    import llamafactory.data.loader as loader
    from llamafactory.hparams import ModelArguments
    from transformers import Seq2SeqTrainingArguments

    data_args = DataArguments(dataset="mine", dataset_dir=str(tmp_path), streaming=streaming, overwrite_cache=True)
    model_args = ModelArguments(model_name_or_path=str(tokenizer_dir))
    (attr,) = loader.get_dataset_list(["mine"], data_args.dataset_dir)
    # LLaMA-Factory streams a local file in dataloader_num_workers shards (0 shards: nothing)
    training_args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / "out"), report_to="none", dataloader_num_workers=1
    )
    return loader._load_single_dataset(attr, model_args, data_args, training_args)


GOOD = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
UNANSWERED = {"conversations": [{"from": "human", "value": "q"}]}


@pytest.mark.parametrize("streaming", [False, True])
def test_loaded_rows_hold_stock_columns_and_skipped_rows_are_still_named(
    tmp_path, tiny_tokenizer_dir, monkeypatch, streaming
):
    import llamafactory.data.loader as loader

    warnings = []
    monkeypatch.setattr(loader.logger, "warning_rank0", warnings.append)
    entry = {"formatting": "sharegpt", "columns": {"messages": "conversations"}, "skip_invalid_rows": True}
    _write(tmp_path, [GOOD, UNANSWERED, GOOD], entry)
    rows = list(_single_dataset(tmp_path, tiny_tokenizer_dir, streaming))
    assert [list(row) for row in rows] == [STOCK_KEYS, STOCK_KEYS]
    assert [row["_response"][0]["content"] for row in rows] == ["hello", "hello"]
    if not streaming:  # streamed rows are only seen during training: the guard's own warning names them
        (warning,) = [w for w in warnings if "skipping" in w]
        assert "dataset 'mine': skipping 1 of 3 rows (skip_invalid_rows): broken role order x1: rows 1" in warning


def test_tokenized_dataset_is_the_same_with_and_without_the_guard(tmp_path, tiny_tokenizer_dir, monkeypatch):
    """``get_dataset`` end to end: the plugin's converter gives the rows stock LLaMA-Factory tokenizes."""
    _write(tmp_path, [GOOD, GOOD], {"formatting": "sharegpt", "columns": {"messages": "conversations"}})
    values = {
        "model_name_or_path": str(tiny_tokenizer_dir),
        "dataset": "mine",
        "dataset_dir": str(tmp_path),
        "template": "qwen3",
        "cutoff_len": 64,
        "output_dir": str(tmp_path / "out"),
    }
    guarded = load_with_llamafactory(values, "sft")[0]["train_dataset"]
    monkeypatch.setattr(
        converter_module, "get_dataset_converter", getattr(converter_module.get_dataset_converter, ORIGINAL)
    )
    stock = load_with_llamafactory(values, "sft")[0]["train_dataset"]
    assert guarded.column_names == stock.column_names
    assert guarded.to_list() == stock.to_list()

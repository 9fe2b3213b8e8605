"""Rows are checked for the stage that trains on them, as LLaMA-Factory's own converters and processors read them.

Every example format of LLaMA-Factory 0.9.5's ``data/README.md`` that a text model can train on is written as a
fixture in ``tests/fixtures/llamafactory_readme/`` (the README's rows and ``dataset_info.json`` entries); each loads
through ``get_dataset`` for its stage with the plugin exactly as stock LLaMA-Factory loads it (same token ids,
no row lost). Each row that stock would silently drop, misread or crash on is named by file, row and field;
the test shows what stock does with it. (The README's multimodal formats need a multimodal template: for a
text model stock refuses them itself.)
"""

import json
import re

import llamafactory.data.converter as converter_module
import llamafactory.data.loader as loader_module
import pytest
from llamafactory.hparams import ModelArguments
from llamafactory_data import load_with_llamafactory
from repo_paths import FIXTURES

from llamafactory_zebra.data.row_policy import EmptyDataError, MalformedDataError
from llamafactory_zebra.data.stages import StageMismatchError
from llamafactory_zebra.seam import ORIGINAL

pytestmark = pytest.mark.usefixtures("dataset_seams")

README = FIXTURES / "llamafactory_readme"
STOCK_SEAMS = (
    (loader_module, "_get_merged_dataset"),
    (loader_module, "_load_single_dataset"),
    (converter_module, "get_dataset_converter"),
)

# (dataset in README/dataset_info.json, loader stage): every README format a text model trains on.
README_CASES = [
    ("alpaca_sft", "sft"),
    ("alpaca_pt", "pt"),
    ("alpaca_pt_txt", "pt"),
    ("alpaca_preference", "rm"),
    ("alpaca_kto", "kto"),
    ("sharegpt_sft", "sft"),
    ("sharegpt_preference", "rm"),
    ("sharegpt_kto", "kto"),
    ("openai_sft", "sft"),
]


@pytest.fixture(scope="module")
def tokenizer_module(tiny_tokenizer_dir):
    from llamafactory.model import load_tokenizer

    return load_tokenizer(ModelArguments(model_name_or_path=str(tiny_tokenizer_dir)))


def _load(tokenizer_dir, tokenizer_module, dataset_dir, name, stage, tmp_path):
    values = {
        "model_name_or_path": str(tokenizer_dir),
        "dataset": name,
        "dataset_dir": str(dataset_dir),
        "template": "qwen3",
        "cutoff_len": 256,
        "output_dir": str(tmp_path / "out"),
    }
    return load_with_llamafactory(values, stage, tokenizer_module)[0]["train_dataset"]


def _load_stock(monkeypatch, *args):
    """The same load with LLaMA-Factory's own functions in place of the plugin's wrappers."""
    with monkeypatch.context() as patch:
        for module, name in STOCK_SEAMS:
            patch.setattr(module, name, getattr(getattr(module, name), ORIGINAL))
        return _load(*args)


def _rows_in(path):
    if path.suffix == ".json":
        return len(json.loads(path.read_text()))
    return len([line for line in path.read_text().splitlines() if line.strip()])


@pytest.mark.parametrize(("name", "stage"), README_CASES)
def test_readme_formats_load_as_stock_loads_them(
    name, stage, tiny_tokenizer_dir, tokenizer_module, tmp_path, monkeypatch
):
    args = (tiny_tokenizer_dir, tokenizer_module, README, name, stage, tmp_path)
    ours = _load(*args)
    stock = _load_stock(monkeypatch, *args)
    entry = json.loads((README / "dataset_info.json").read_text())[name]
    assert len(ours) == _rows_in(README / entry["file_name"]) > 0
    assert ours.column_names == stock.column_names
    for column in ours.column_names:
        assert ours[column] == stock[column], column


ALPACA_PT = {"columns": {"prompt": "text"}}
SHAREGPT = {"formatting": "sharegpt", "columns": {"messages": "conversations"}}
SHAREGPT_PAIRS = {**SHAREGPT, "ranking": True, "columns": {**SHAREGPT["columns"], "chosen": "c", "rejected": "r"}}
SHAREGPT_KTO = {**SHAREGPT, "columns": {**SHAREGPT["columns"], "kto_tag": "tag"}}
ALPACA_PAIRS = {"ranking": True, "columns": {"prompt": "instruction", "chosen": "c", "rejected": "r"}}
ALPACA_KTO = {"columns": {"prompt": "instruction", "response": "output", "kto_tag": "tag"}}


def _turns(*roles_and_texts):
    return [{"from": role, "value": text} for role, text in roles_and_texts]


def _gpt(text):
    return {"from": "gpt", "value": text}


# (stage, entry, good row, bad row, field named, what stock does with the bad row).
BAD_ROWS = {
    "pt empty text": ("pt", ALPACA_PT, {"text": "a document"}, {"text": " "}, "text", "misreads"),
    "pt null text": ("pt", ALPACA_PT, {"text": "a document"}, {"text": None}, "text", "misreads"),
    "pt text of another type": ("pt", ALPACA_PT, {"text": "a document"}, {"text": 5}, "text", "crashes"),
    "pt sharegpt answer first": (
        "pt",
        SHAREGPT,
        {"conversations": _turns(("human", "q"), ("gpt", "a"))},
        {"conversations": _turns(("gpt", "a"), ("human", "q"))},
        "conversations[0]",
        "crashes",
    ),
    "sft sharegpt ends with a question": (
        "sft",
        SHAREGPT,
        {"conversations": _turns(("human", "q"), ("gpt", "a"))},
        {"conversations": _turns(("human", "q"), ("gpt", "a"), ("human", "q2"))},
        "conversations",
        "drops",
    ),
    "pairwise alpaca rejected missing": (
        "rm",
        ALPACA_PAIRS,
        {"instruction": "q", "c": "good", "r": "bad"},
        {"instruction": "q", "c": "good", "r": None},
        "r",
        "drops",
    ),
    "pairwise alpaca empty chosen": (
        "rm",
        ALPACA_PAIRS,
        {"instruction": "q", "c": "good", "r": "bad"},
        {"instruction": "q", "c": "", "r": "bad"},
        "c",
        "misreads",
    ),
    "pairwise sharegpt conversation ends with an answer": (
        "rm",
        SHAREGPT_PAIRS,
        {"conversations": _turns(("human", "q")), "c": _gpt("good"), "r": _gpt("bad")},
        {"conversations": _turns(("human", "q"), ("gpt", "a")), "c": _gpt("good"), "r": _gpt("bad")},
        "conversations",
        "drops",
    ),
    "pairwise sharegpt chosen by the user": (
        "rm",
        SHAREGPT_PAIRS,
        {"conversations": _turns(("human", "q")), "c": _gpt("good"), "r": _gpt("bad")},
        {"conversations": _turns(("human", "q")), "c": {"from": "human", "value": "good"}, "r": _gpt("bad")},
        "c",
        "misreads",
    ),
    "pairwise sharegpt rejected missing": (
        "rm",
        SHAREGPT_PAIRS,
        {"conversations": _turns(("human", "q")), "c": _gpt("good"), "r": _gpt("bad")},
        {"conversations": _turns(("human", "q")), "c": _gpt("good"), "r": None},
        "r",
        "drops",
    ),
    "kto alpaca tag missing": (
        "kto",
        ALPACA_KTO,
        {"instruction": "q", "output": "a", "tag": True},
        {"instruction": "q", "output": "a", "tag": None},
        "tag",
        "drops",
    ),
    "kto alpaca empty answer": (
        "kto",
        ALPACA_KTO,
        {"instruction": "q", "output": "a", "tag": True},
        {"instruction": "q", "output": "", "tag": True},
        "output",
        "misreads",
    ),
    "kto sharegpt tag missing": (
        "kto",
        SHAREGPT_KTO,
        {"conversations": _turns(("human", "q"), ("gpt", "a")), "tag": False},
        {"conversations": _turns(("human", "q"), ("gpt", "a")), "tag": None},
        "tag",
        "drops",
    ),
}


def _write_dataset(directory, entry, rows, name="mine", file_name="data.jsonl"):
    directory.mkdir(exist_ok=True)
    (directory / "dataset_info.json").write_text(json.dumps({name: {"file_name": file_name, **entry}}))
    (directory / file_name).write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_rows_stock_drops_misreads_or_crashes_on_are_named(
    case, tiny_tokenizer_dir, tokenizer_module, tmp_path, monkeypatch
):
    stage, entry, good, bad, field, stock_outcome = BAD_ROWS[case]
    data = tmp_path / "data"
    _write_dataset(data, entry, [good, bad, good])
    args = (tiny_tokenizer_dir, tokenizer_module, data, "mine", stage, tmp_path)
    with pytest.raises(MalformedDataError) as raised:
        _load(*args)
    message = str(raised.value)
    assert message.startswith(f"Dataset 'mine' ({data / 'data.jsonl'}, formatting ")
    assert f"data.jsonl row 1 (line 2): field '{field}':" in message, message
    assert "1 malformed row(s)" in message and "A valid row of this entry looks like:" in message

    if stock_outcome == "crashes":
        with pytest.raises(Exception):  # noqa: B017 - any of datasets' or LLaMA-Factory's errors
            _load_stock(monkeypatch, *args)
        return
    stock = _load_stock(monkeypatch, *args)
    assert len(stock) == (2 if stock_outcome == "drops" else 3)


def test_a_skipped_pretraining_row_never_reaches_the_text(tiny_tokenizer_dir, tokenizer_module, tmp_path):
    """Pre-training reads every converted row's first turn: a refused row must leave the dataset, not train
    as an empty document."""
    data = tmp_path / "data"
    _write_dataset(data, {**ALPACA_PT, "skip_invalid_rows": True}, [{"text": "a document"}, {"text": ""}])
    rows = _load(tiny_tokenizer_dir, tokenizer_module, data, "mine", "pt", tmp_path)
    text = tokenizer_module["tokenizer"].decode(rows[0]["input_ids"])
    assert len(rows) == 1 and text.startswith("a document")


def test_a_skipped_kto_row_does_not_shift_its_neighbours_kl_response(tiny_tokenizer_dir, tokenizer_module, tmp_path):
    """KTO pairs each row with the previous row's response; a refused row left in would be one of them."""
    data = tmp_path / "data"
    rows = [
        {"instruction": "q1", "output": "a1", "tag": True},
        {"instruction": "q2", "output": "a2", "tag": None},
        {"instruction": "q3", "output": "a3", "tag": False},
    ]
    _write_dataset(data, {**ALPACA_KTO, "skip_invalid_rows": True}, rows)
    loaded = _load(tiny_tokenizer_dir, tokenizer_module, data, "mine", "kto", tmp_path)
    assert loaded["kto_tags"] == [True, False]


@pytest.mark.parametrize(
    ("stage", "entry", "ours", "stock"),
    [
        ("rm", SHAREGPT, "is not a preference dataset, and preference training", "not applicable in the current"),
        ("sft", SHAREGPT_PAIRS, 'has "ranking": true (a preference dataset), which supervised', "not applicable"),
        ("kto", SHAREGPT, 'maps no "kto_tag" column, and KTO (stage kto) needs one', "Cannot find valid samples"),
        ("sft", SHAREGPT_KTO, 'maps a "kto_tag" column, so LLaMA-Factory shapes its rows as KTO', "Cannot find valid"),
    ],
)
def test_an_entry_the_stage_cannot_train_on_is_refused_by_name(
    stage, entry, ours, stock, tiny_tokenizer_dir, tokenizer_module, tmp_path, monkeypatch
):
    data = tmp_path / "data"
    row = {"conversations": _turns(("human", "q"), ("gpt", "a")), "c": _gpt("a"), "r": _gpt("b"), "tag": True}
    if entry is SHAREGPT_PAIRS:
        row["conversations"] = row["conversations"][:1]
    _write_dataset(data, entry, [row])
    args = (tiny_tokenizer_dir, tokenizer_module, data, "mine", stage, tmp_path)
    with pytest.raises(
        StageMismatchError, match="^" + re.escape(f"Dataset 'mine' (its dataset_info.json entry) {ours}")
    ):
        _load(*args)
    with pytest.raises((ValueError, RuntimeError), match=stock):
        _load_stock(monkeypatch, *args)


@pytest.mark.parametrize(
    ("file_name", "content", "why"),
    [
        ("data.json", "", "the file is empty (0 bytes)"),
        ("data.json", "[ ]\n", "the file holds an empty JSON array []"),
        ("data.jsonl", "\n\n", "the file holds only whitespace"),
    ],
)
def test_empty_files_are_named_with_their_dataset(
    file_name, content, why, tiny_tokenizer_dir, tokenizer_module, tmp_path
):
    data = tmp_path / "data"
    _write_dataset(data, ALPACA_PT, [], file_name=file_name)
    (data / file_name).write_text(content)
    with pytest.raises(EmptyDataError) as raised:
        _load(tiny_tokenizer_dir, tokenizer_module, data, "mine", "pt", tmp_path)
    assert str(raised.value).splitlines() == [
        "Dataset 'mine' has no rows to train on:",
        f"  - {data / file_name}: {why}",
        "Each file needs at least one row; a valid row of this entry looks like:",
        '  {"text": "document"}',
    ]


def test_an_empty_folder_and_an_empty_file_among_others_are_named(tiny_tokenizer_dir, tokenizer_module, tmp_path):
    data = tmp_path / "data"
    (data / "parts").mkdir(parents=True)
    (data / "dataset_info.json").write_text(json.dumps({"mine": {"file_name": "parts", **SHAREGPT}}))
    with pytest.raises(EmptyDataError, match="the folder holds no files"):
        _load(tiny_tokenizer_dir, tokenizer_module, data, "mine", "sft", tmp_path)
    (data / "parts" / "a.jsonl").write_text(json.dumps({"conversations": _turns(("human", "q"), ("gpt", "a"))}) + "\n")
    (data / "parts" / "b.jsonl").write_text("")
    with pytest.raises(EmptyDataError) as raised:
        _load(tiny_tokenizer_dir, tokenizer_module, data, "mine", "sft", tmp_path)
    assert f"  - {data / 'parts' / 'b.jsonl'}: the file is empty (0 bytes)" in str(raised.value)
    assert "a.jsonl" not in str(raised.value)


def test_a_prediction_set_needs_no_answers(tiny_tokenizer_dir, tokenizer_module, tmp_path):
    """``predict_with_generate`` evaluates with LLaMA-Factory's unsupervised processor: prompts only."""
    data = tmp_path / "data"
    _write_dataset(data, {"columns": {"prompt": "instruction"}}, [{"instruction": "q1"}, {"instruction": "q2"}])
    values = {
        "model_name_or_path": str(tiny_tokenizer_dir),
        "eval_dataset": "mine",
        "dataset_dir": str(data),
        "template": "qwen3",
        "output_dir": str(tmp_path / "out"),
        "do_predict": True,
        "predict_with_generate": True,
    }
    loaded = load_with_llamafactory(values, "sft", tokenizer_module)[0]
    assert len(loaded["eval_dataset"]) == 2

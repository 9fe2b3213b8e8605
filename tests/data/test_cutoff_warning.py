"""SFT rows longer than ``cutoff_len`` are named, with the fix, before LLaMA-Factory truncates them."""

from __future__ import annotations

import json

import pytest
from llamafactory_data import load_with_llamafactory


def _write(tmp_path, answers: list[str]) -> None:
    rows = [{"instruction": "Repeat the words.", "input": "", "output": answer} for answer in answers]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"mine": {"file_name": "rows.json"}}))


def _warnings(tmp_path, tiny_tokenizer_dir, monkeypatch, **values) -> list[str]:
    import llamafactory.data.loader as loader

    warnings: list[str] = []
    monkeypatch.setattr(loader.logger, "warning_rank0", warnings.append)
    load_with_llamafactory(
        {
            "model_name_or_path": str(tiny_tokenizer_dir),
            "dataset": "mine",
            "dataset_dir": str(tmp_path),
            "template": "zebra",
            "output_dir": str(tmp_path / "out"),
            "do_train": True,
            **values,
        },
        "sft",
    )
    return [w for w in warnings if "cutoff_len" in w]


@pytest.mark.parametrize("packing", [False, True])
def test_rows_over_cutoff_are_counted_and_the_fix_named(tmp_path, tiny_tokenizer_dir, monkeypatch, packing):
    _write(tmp_path, ["short", "word " * 200, "ok", "word " * 300])
    (warning,) = _warnings(tmp_path, tiny_tokenizer_dir, monkeypatch, cutoff_len=128, packing=packing)
    assert warning.startswith("2 of 4 rows are longer than a training row holds")
    assert "rows 1, 3" in warning and "truncates them silently" in warning
    longest = int(warning.split("up to ")[1].split(" tokens")[0])
    assert longest > 300 and f"Set cutoff_len: {longest + int(packing)}" in warning
    assert ("less the one token packing keeps" in warning) == packing


def test_rows_that_fit_say_nothing(tmp_path, tiny_tokenizer_dir, monkeypatch):
    _write(tmp_path, ["short", "word " * 20])
    assert _warnings(tmp_path, tiny_tokenizer_dir, monkeypatch, cutoff_len=256) == []


@pytest.mark.parametrize("template_name", ["zebra", "bailing"])  # bailing: a template with efficient_eos
def test_row_tokens_is_the_length_the_supervised_processor_builds(tiny_tokenizer_dir, template_name):
    from llamafactory.data import get_template_and_fix_tokenizer
    from llamafactory.data.processor import SupervisedDatasetProcessor
    from llamafactory.hparams import DataArguments
    from transformers import AutoTokenizer

    from llamafactory_zebra.data.cutoff import row_tokens

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    data_args = DataArguments(template=template_name, cutoff_len=4096, enable_thinking=False)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    processor = SupervisedDatasetProcessor(template=template, tokenizer=tokenizer, processor=None, data_args=data_args)
    messages = [
        {"role": "user", "content": "Where is the key?"},
        {"role": "assistant", "content": "Under the mat."},
        {"role": "user", "content": "And the door?"},
        {"role": "assistant", "content": "Open."},
    ]
    input_ids, _ = processor._encode_data_example(messages[:3], messages[3:], "", "", [], [], [])
    assert row_tokens(template, tokenizer, messages, "", "") == len(input_ids)
    assert template.efficient_eos == (template_name == "bailing")

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

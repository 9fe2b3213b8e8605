"""The long-context SFT generator: LLaMA-Factory's schema, rows that fit their length, determinism, and no
eval-long sample in the training data for any seed of either."""

from __future__ import annotations

import json
import random
import re
import string

import pytest

from llamafactory_zebra.cli.main import main
from llamafactory_zebra.data import retrieval_sft as rs
from llamafactory_zebra.evaluation import tasks as eval_tasks
from llamafactory_zebra.evaluation.haystack import noise_haystack
from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer


@pytest.fixture(scope="module")
def sizing(tmp_path_factory):
    model = tmp_path_factory.mktemp("tokenizer")
    build_tiny_tokenizer().save_pretrained(model)
    return model, *rs.template_measure(str(model), "zebra")


def test_key_alphabet_is_disjoint_from_eval_long_pseudo_words_by_construction():
    eval_letters = set(eval_tasks.PSEUDO_WORD_CONSONANTS) | set(eval_tasks.PSEUDO_WORD_VOWELS)
    assert not set(rs.KEY_MARKS) & eval_letters
    # Every key holds a mark, so no key is ever a string over eval-long's letters.
    for seed in range(2000):
        key = rs.key_name(random.Random(seed), (1, 4))
        assert set(key) & set(rs.KEY_MARKS), key
        assert set(key) <= set(rs.KEY_CONSONANTS) | set(eval_tasks.PSEUDO_WORD_VOWELS)
    # And eval-long's keys are drawn from exactly the letters the constants name (no mark can appear).
    for seed in range(200):
        assert set(eval_tasks.pseudo_word(random.Random(seed))) <= eval_letters


def test_variable_names_never_have_eval_long_length():
    assert eval_tasks.VARIABLE_NAME_LENGTH not in rs.TRACKING_NAME_LENGTHS
    for seed in range(500):
        name = rs.tracking_name(random.Random(seed))
        assert len(name) in rs.TRACKING_NAME_LENGTHS and set(name) <= set(eval_tasks.VARIABLE_LETTERS)


def test_no_eval_long_key_or_variable_appears_in_generated_rows(sizing):
    _, measure, encode = sizing
    options = rs.RetrievalOptions(needles=(2, 4), multivalue_share=0.5, tracking_share=1.0)
    text = json.dumps(rs.make_rows(30, (300, 700), 7, measure, encode, options))
    words = set(text.replace('"', " ").replace(".", " ").replace(",", " ").replace("?", " ").split())
    haystack = noise_haystack(encode)

    def prompt_tokens(sample):
        return len(encode(sample.prompt))

    for seed in range(3):
        rng = random.Random(seed)
        for task in ("niah_single", "niah_multikey", "niah_multivalue", "variable_tracking"):
            sample = eval_tasks.TASKS[task](512, 0, 0.5, rng, haystack, prompt_tokens, eval_tasks.TaskOptions())
            names = (
                list(sample.answers) if task == "variable_tracking" else re.findall(r"for (\w+) is:", sample.context)
            )
            assert names and not words & set(names), (task, names)


def test_rows_are_sharegpt_conversations_that_fit_their_length(sizing):
    _, measure, encode = sizing
    options = rs.RetrievalOptions(needles=(1, 3), questions=3, multivalue_share=0.5, tracking_share=0.5)
    rows = rs.make_rows(12, (400, 900), 3, measure, encode, options)
    for row in rows:
        messages = row["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"] * (len(messages) // 2)
        assert 300 <= measure(messages) <= 900
        context = messages[0]["content"]
        for answer in messages[1::2]:
            values = [w.strip(".,") for w in answer["content"].split() if w.strip(".,").isdigit()]
            names = answer["content"].split("they are:")[-1].split() if "they are:" in answer["content"] else []
            assert all(value in context for value in values) and all(f"VAR {n}" in context for n in names)


def _noise_filled(row, noise) -> bool:
    """Whether every filler sentence of the row's context is one of the noise haystack's."""
    context = row["messages"][0]["content"].rsplit("\n\n", 1)[0]
    sentences = {s.strip() + "." for s in context.split(".") if s.strip()}
    return {s for s in sentences if "special magic number" not in s} <= noise


def test_noise_filler_share_hides_needles_in_eval_long_noise_with_keys_eval_long_never_draws(sizing):
    _, measure, encode = sizing
    noise = set(noise_haystack(encode).sentences)
    needles = {"needles": (1, 3), "multivalue_share": 0.0, "tracking_share": 0.0}
    rows = rs.make_rows(40, (300, 500), 9, measure, encode, rs.RetrievalOptions(noise_filler_share=0.5, **needles))
    assert 8 <= sum(_noise_filled(row, noise) for row in rows) <= 32  # about half of 40
    for row in rows:
        for key in re.findall(r"for (\w+) is:", row["messages"][0]["content"]):
            assert set(key) & set(rs.KEY_MARKS), key
    # A share of 0 draws nothing more: the rows every earlier run wrote, none of them in the noise.
    plain = rs.make_rows(5, (300, 500), 9, measure, encode, rs.RetrievalOptions(**needles))
    zero = rs.RetrievalOptions(noise_filler_share=0.0, **needles)
    assert plain == rs.make_rows(5, (300, 500), 9, measure, encode, zero)
    assert not any(_noise_filled(row, noise) for row in plain)


def test_rows_are_deterministic_per_seed_and_index(sizing):
    _, measure, encode = sizing
    options = rs.RetrievalOptions()
    first = rs.make_rows(4, (300, 600), 5, measure, encode, options)
    assert first == rs.make_rows(4, (300, 600), 5, measure, encode, options)
    assert first[:2] == rs.make_rows(2, (300, 600), 5, measure, encode, options)
    assert first != rs.make_rows(4, (300, 600), 6, measure, encode, options)


def test_cli_writes_the_dataset_and_its_dataset_info_entry(sizing, tmp_path, capsys):
    model, measure, _ = sizing
    (tmp_path / "dataset_info.json").write_text(json.dumps({"mine": {"file_name": "mine.json"}}))
    argv = ["--model", str(model), "--output-dir", str(tmp_path), "--name", "long", "--rows", "3", "--lengths", "512"]
    assert main(["data", "retrieval-sft", *argv]) == 0
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    assert info["mine"] == {"file_name": "mine.json"}
    assert info["long"] == {"file_name": "long.json", **rs.SHAREGPT_ENTRY}
    rows = json.loads((tmp_path / "long.json").read_text())
    assert len(rows) == 3 and all(measure(row["messages"]) <= 512 for row in rows)
    assert "wrote 3 rows" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--lengths", "900-300"], "--lengths"),
        (["--needles", "3-1"], "needles"),
        (["--questions", "0"], "questions"),
        (["--noise-filler-share", "1.5"], "noise_filler_share"),
    ],
)
def test_bad_options_are_named_before_anything_is_written(sizing, tmp_path, capsys, argv, named):
    model, _, _ = sizing
    base = ["--model", str(model), "--output-dir", str(tmp_path), "--name", "x", "--rows", "2", "--lengths", "512"]
    assert main(["data", "retrieval-sft", *base, *argv]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_letters_of_the_key_marks_are_lower_case_ascii():
    assert set(rs.KEY_MARKS) <= set(string.ascii_lowercase)

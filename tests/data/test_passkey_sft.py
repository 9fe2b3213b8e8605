"""Passkey SFT rows: eval-long's wording, sized in template tokens, and never an eval-long sample."""

from __future__ import annotations

import random
import re

import pytest

from llamafactory_zebra.data import passkey_sft as ps
from llamafactory_zebra.data import retrieval_sft as rs
from llamafactory_zebra.evaluation import tasks as eval_tasks
from llamafactory_zebra.evaluation.haystack import noise_haystack
from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer

NEEDLE = re.compile(r"The pass key is (\d+)\. Remember it\. (\d+) is the pass key\.")


@pytest.fixture(scope="module")
def sizing(tmp_path_factory):
    model = tmp_path_factory.mktemp("tokenizer")
    build_tiny_tokenizer().save_pretrained(model)
    return rs.template_measure(str(model), "zebra")


def test_rows_are_never_eval_long_samples_by_construction(sizing):
    measure, encode = sizing
    eval_digits = eval_tasks.TaskOptions().passkey_digits
    options = ps.PasskeyOptions()
    assert eval_digits in ps.KEY_DIGITS
    # The standard filler's rows never take eval-long's key length; the grammar's rows take every length.
    assert {len(ps.passkey_key(random.Random(n), options, True)) for n in range(2000)} == set(ps.KEY_DIGITS) - {
        eval_digits
    }
    assert {len(ps.passkey_key(random.Random(n), options, False)) for n in range(2000)} == set(ps.KEY_DIGITS)
    rows = ps.make_passkey_rows(60, (200, 400), 5, measure, encode, ps.PasskeyOptions(other_filler_share=0.5))
    lengths_by_filler = {True: set(), False: set()}
    for row in rows:
        text = row["messages"][0]["content"]
        standard = "The grass is green." in text or "The sky is blue." in text
        lengths_by_filler[standard].add(len(NEEDLE.findall(text)[0][0]))
    assert eval_digits not in lengths_by_filler[True] and eval_digits in lengths_by_filler[False]
    # and eval-long's keys always have exactly its digit count
    haystack = noise_haystack(lambda text: list(text.encode()))
    for seed in range(50):
        sample = eval_tasks.passkey(2000, 0, 0.5, random.Random(seed), haystack, lambda s: len(s.prompt) // 4,
                                    eval_tasks.TaskOptions())  # fmt: skip
        assert len(sample.answers[0]) == eval_digits


def test_rows_use_eval_long_wording_fit_their_lengths_and_answer_from_the_needle(sizing):
    measure, encode = sizing
    rows = ps.make_passkey_rows(40, (300, 900), 3, measure, encode, ps.PasskeyOptions())
    assert rows == ps.make_passkey_rows(40, (300, 900), 3, measure, encode, ps.PasskeyOptions())
    grammar_rows = 0
    for row in rows:
        user, assistant = row["messages"]
        assert 0.8 * 300 <= measure(row["messages"]) <= 900
        assert user["content"].startswith(eval_tasks.PASSKEY_INSTRUCTION + " ")
        assert user["content"].endswith("\n\n" + eval_tasks.PASSKEY_QUESTION)
        (needle,) = NEEDLE.findall(user["content"])
        assert needle[0] == needle[1] and len(needle[0]) in ps.KEY_DIGITS
        assert assistant["content"] == f"{eval_tasks.PASSKEY_ANSWER_PREFIX} {needle[0]}."
        grammar_rows += "The grass is green. The sky is blue." not in user["content"]
    # A quarter of the rows (the default share) hide the needle in the grammar's sentences instead.
    assert 4 <= grammar_rows <= 18


def test_rows_too_short_for_the_instruction_go_without_it_and_the_share_holds_elsewhere(sizing):
    measure, encode = sizing
    short = ps.make_passkey_rows(10, (100, 140), 4, measure, encode, ps.PasskeyOptions(instruction_share=1.0))
    assert not any(eval_tasks.PASSKEY_INSTRUCTION in row["messages"][0]["content"] for row in short)
    rows = ps.make_passkey_rows(40, (400, 600), 4, measure, encode, ps.PasskeyOptions(instruction_share=0.5))
    opened = sum(row["messages"][0]["content"].startswith(eval_tasks.PASSKEY_INSTRUCTION) for row in rows)
    assert 10 <= opened <= 30


def test_options_refuse_eval_long_digit_count_and_bad_shares():
    with pytest.raises(ValueError, match="key_digits.*at least one other than eval-long's 5"):
        ps.PasskeyOptions(key_digits=(5,))
    with pytest.raises(ValueError, match="other_filler_share"):
        ps.PasskeyOptions(other_filler_share=1.5)
    with pytest.raises(ValueError, match="instruction_share -0.1: need a share from 0 to 1"):
        ps.PasskeyOptions(instruction_share=-0.1)

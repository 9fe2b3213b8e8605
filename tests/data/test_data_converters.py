"""Converters and row checks on hand-written rows (no files, no tokenizer)."""

import llamafactory.data.converter as converter_module
import pytest
from llamafactory.data.parser import DatasetAttr
from llamafactory.data.template import TEMPLATES
from llamafactory.hparams import DataArguments

from llamafactory_zebra.data.converters import (
    ZEBRA_CONVERTERS,
    format_thinking,
    normalize_thinking,
    openthoughts_to_thinking,
    split_chatqa_prompt,
)
from llamafactory_zebra.data.registry import registry_dataset_info
from llamafactory_zebra.data.validation import (
    DROP_REASON_COLUMN,
    DropRow,
    GuardedConverter,
    collecting_drop_reasons,
)

pytestmark = pytest.mark.usefixtures("dataset_seams")


def get_dataset_converter(name, attr, data_args):
    """Looked up at call time: the seam replaces the module attribute."""
    return converter_module.get_dataset_converter(name, attr, data_args)


def _attr(name: str) -> DatasetAttr:
    entry = registry_dataset_info()[name]
    attr = DatasetAttr("file", dataset_name=entry["file_name"])
    attr.join(entry)
    attr.zebra_name = name
    return attr


def _converter(name: str) -> GuardedConverter:
    attr = _attr(name)
    return get_dataset_converter(attr.formatting, attr, DataArguments())


def _convert(name: str, row: dict) -> dict:
    return _converter(name)(row)


def _reason(name: str, row: dict) -> str:
    return _converter(name).reason(row)


def test_thinking_format_is_the_qwen3_templates_thought_words():
    open_words, close_words = TEMPLATES["qwen3"].thought_words
    assert format_thinking("step", "answer") == f"{open_words}step{close_words}answer"
    assert TEMPLATES["qwen3"].remove_thought(format_thinking("a\nb", "c")) == "c"


def test_normalize_thinking_follows_qwen3_template_spacing():
    assert normalize_thinking("<think>\n\nR\n\n</think>\n\n\nA") == "<think>\nR\n</think>\n\nA"
    assert normalize_thinking("<think>R</think>A") == "<think>\nR\n</think>\n\nA"
    assert normalize_thinking("plain answer") == "plain answer"
    with pytest.raises(DropRow, match="without '</think>'"):
        normalize_thinking("<think>\nunfinished")
    with pytest.raises(DropRow, match="no answer after"):
        normalize_thinking("<think>\nR\n</think>\n\n  ")


def test_openthoughts_markers_become_a_think_block():
    content = (
        "<|begin_of_thought|>\n\nT1\n\nT2\n\n<|end_of_thought|>\n\n<|begin_of_solution|>\n\nS\n\n<|end_of_solution|>"
    )
    assert openthoughts_to_thinking(content) == "<think>\nT1\n\nT2\n</think>\n\nS"
    assert openthoughts_to_thinking("<|begin_of_thought|>T<|end_of_thought|>\nS") == "<think>\nT\n</think>\n\nS"
    with pytest.raises(DropRow, match="incomplete reasoning"):
        openthoughts_to_thinking("<|begin_of_thought|>T")


@pytest.mark.parametrize(
    ("question", "system", "user"),
    [
        ("System: Be helpful.\n\nUser: ctx\n\nQ?\n\nAssistant:", "Be helpful.", "ctx\n\nQ?"),
        ("User: ctx\n\nQ?\n\nAssistant:", "", "ctx\n\nQ?"),
        ("plain question", "", "plain question"),
    ],
)
def test_chatqa_framing_is_split(question, system, user):
    assert split_chatqa_prompt(question) == (system, user)


def test_chatqa2_converter_uses_the_first_nonempty_answer():
    row = {"question": "User: c\n\nq\n\nAssistant:", "answer": [" ", "B"]}
    out = _convert("chatqa2_narrativeqa_131k_sample", row)
    assert out["_prompt"] == [{"role": "user", "content": "c\n\nq"}]
    assert out["_response"] == [{"role": "assistant", "content": "B"}]
    assert _reason("chatqa2_narrativeqa_131k_sample", row) == ""


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (
            {"question": "User: q\n\nAssistant:", "answer": []},
            "empty response: answer column 'answer' is an empty list",
        ),
        ({"question": "User: q\n\nAssistant:", "answer": ""}, "empty response: answer column 'answer' is empty"),
        (
            {"question": "User: q\n\nAssistant:", "answer": 3},
            "wrong type: answer column 'answer' must be a string, got int",
        ),
        (
            {"question": "User: q\n\nAssistant:", "answer": [1, 2]},
            "wrong type: answer column 'answer' must hold strings",
        ),
        ({"question": None, "answer": "a"}, "missing value: question column 'question' is null"),
        ({"question": "User:\n\nAssistant:", "answer": "a"}, "empty text: the question holds nothing besides"),
    ],
)
def test_chatqa2_bad_rows_are_dropped_with_a_reason(row, expected):
    assert _reason("chatqa2_long_sft_sample", row).startswith(expected)


_ROLE_CONTENT_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}


def _conversation(*turns, column="messages", role="role", content="content"):
    return {column: [{role: r, content: c} for r, c in turns]}


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (_conversation(("assistant", "hi"), ("user", "x")), "broken role order: message 0 has role 'assistant'"),
        (
            _conversation(("user", "a"), ("assistant", "b"), ("user", "c")),
            "broken role order: messages column 'messages' ends with a 'user' turn",
        ),
        (_conversation(("system", "s"), ("user", "a"), ("user", "b")), "broken role order: message 2 has role 'user'"),
        (_conversation(("user", "a"), ("assistant", " \n")), "empty response: message 1 ('assistant') is empty"),
        (_conversation(("system", "s")), "empty conversation"),
        ({"messages": None}, "missing value: messages column 'messages' is null"),
        ({"messages": "user: hi"}, "wrong type: messages column 'messages' must be a list, got str"),
        ({"messages": [{"role": "user", "content": 5}]}, "wrong type: message 0 'content' must be a string, got int"),
        ({"messages": [{"content": "x"}]}, "missing value: message 0 has no 'role'"),
        ({"messages": ["hello"]}, "wrong type: message 0 must be an object, got str"),
    ],
)
def test_message_rows_with_bad_structure_are_dropped(row, expected):
    # sftdatasetv3 uses LLaMA-Factory's own sharegpt converter; openr1 ours: the same checks apply to both.
    assert _reason("sftdatasetv3_sample", row).startswith(expected)
    assert _reason("openr1_math_220k_sample", row).startswith(expected)


def test_reasoning_messages_keep_system_and_history():
    row = _conversation(
        ("system", "S"), ("user", "q1"), ("assistant", "<think>r1</think>a1"), ("user", "q2"), ("assistant", "a2")
    )
    out = _convert("openr1_math_220k_sample", row)
    assert out["_system"] == "S"
    assert out["_prompt"] == [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>\nr1\n</think>\n\na1"},
        {"role": "user", "content": "q2"},
    ]
    assert out["_response"] == [{"role": "assistant", "content": "a2"}]


def test_openthoughts_drops_only_the_marker_system_prompt():
    turns = [{"from": "user", "value": "q"}, {"from": "assistant", "value": "a"}]
    assert (
        _convert("openthoughts114k_sample", {"system": "Use <|begin_of_thought|>.", "conversations": turns})["_system"]
        == ""
    )
    assert (
        _convert("openthoughts114k_sample", {"system": "Be brief.", "conversations": turns})["_system"] == "Be brief."
    )


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"problem": "p", "generated_solution": ""}, "empty response: response column 'generated_solution' is empty"),
        ({"problem": "p", "generated_solution": None}, "missing value: response column 'generated_solution' is null"),
        ({"problem": "p", "generated_solution": ["s"]}, "wrong type: response column 'generated_solution' must be"),
        ({"problem": None, "generated_solution": "s"}, "empty text: prompt column 'problem' is empty"),
        ({"problem": 7, "generated_solution": "s"}, "wrong type: prompt column 'problem' must be a string, got int"),
    ],
)
def test_alpaca_rows_are_checked_before_llamafactorys_converter(row, expected):
    assert _reason("openmathinstruct2_sample", row).startswith(expected)


def test_missing_column_is_a_clear_dataset_error():
    with pytest.raises(ValueError, match=r"Dataset 'openmathinstruct2_sample': column 'generated_solution'"):
        _convert("openmathinstruct2_sample", {"problem": "p", "solution": "s"})
    with pytest.raises(ValueError, match=r"data has columns \['answer', 'query'\]"):
        _convert("chatqa2_long_sft_sample", {"query": "q", "answer": "a"})


def test_unknown_formatting_lists_the_known_ones():
    attr = _attr("sftdatasetv3_sample")
    attr.formatting = "chatml"
    with pytest.raises(ValueError, match="unknown formatting 'chatml'; known: alpaca, sharegpt, openai, zebra_"):
        get_dataset_converter("chatml", attr, DataArguments())


def test_every_converter_runs_behind_the_guard():
    for name in ("alpaca", "sharegpt", "openai", *ZEBRA_CONVERTERS):
        attr = DatasetAttr("file", dataset_name="x.json", formatting=name)
        assert isinstance(get_dataset_converter(name, attr, DataArguments()), GuardedConverter)


def test_a_dataset_that_starts_with_many_bad_rows_still_aligns():
    """datasets types each column from the first written batch (1000 rows): all drops there must
    still give the conversation columns their real type."""
    from datasets import Dataset
    from llamafactory.data.converter import align_dataset
    from llamafactory.data.processor import SupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from transformers import Seq2SeqTrainingArguments

    from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer

    rows = [{"problem": "p", "generated_solution": ""}] * 1000 + [{"problem": "1+1?", "generated_solution": "2"}] * 3
    data_args = DataArguments(template="qwen3", overwrite_cache=True)
    with collecting_drop_reasons():  # as the loader seam loads it
        aligned = align_dataset(
            Dataset.from_list(rows), _attr("openmathinstruct2_sample"), data_args, Seq2SeqTrainingArguments("unused")
        )
    assert aligned[1000]["_prompt"] == [{"role": "user", "content": "1+1?"}]
    assert sum(1 for reason in aligned[DROP_REASON_COLUMN] if reason) == 1000

    tokenizer = build_tiny_tokenizer()
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    processor = SupervisedDatasetProcessor(template=template, tokenizer=tokenizer, processor=None, data_args=data_args)
    assert len(processor.preprocess_dataset(aligned[995:1003])["input_ids"]) == 3


def test_openai_formatting_rows_are_type_checked_then_left_to_llamafactory():
    attr = DatasetAttr("file", dataset_name="chat.jsonl")
    attr.join({"formatting": "openai", "columns": {"messages": "messages"}, "tags": _ROLE_CONTENT_TAGS})
    converter = get_dataset_converter("openai", attr, DataArguments())
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    assert converter.reason(good) == "" and converter(good)["_response"] == [{"role": "assistant", "content": "a"}]
    assert converter.reason({"messages": None}) == "missing value: messages column 'messages' is null"
    assert converter.reason({"messages": [{"content": "q"}]}) == "missing value: message 0 has no 'role'"
    assert converter.reason({"messages": [{"role": "assistant", "content": "a"}]}) == (
        "broken role order: LLaMA-Factory's openai converter: it gave 0 prompt turn(s) and 0 response(s); "
        "supervised fine-tuning (stage sft) needs an odd number of prompt turns and exactly 1 response(s)"
    )

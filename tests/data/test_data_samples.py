"""Every shipped sample row, through LLaMA-Factory's loader and ``qwen3`` template, gives this exact text.

The ``*_sample`` twins hold rows in each recipe dataset's public schema, so this checks the
registry entry, the converter and the template together; the tiny tokenizer decodes losslessly.
"""

import llamafactory.data.parser as parser_module
import pytest
from llamafactory.data.loader import _load_single_dataset
from llamafactory.data.template import get_template_and_fix_tokenizer
from llamafactory.hparams import DataArguments, ModelArguments
from transformers import Seq2SeqTrainingArguments

from llamafactory_zebra.data.row_policy import REPORT_ATTRIBUTE
from llamafactory_zebra.data.validation import DROP_REASON_COLUMN
from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer

pytestmark = pytest.mark.usefixtures("dataset_seams")

LIGHTHOUSE = "".join(
    f"Entry {i}: the keeper of the north lighthouse wrote down the wind, the tide and the ships he saw. "
    for i in range(1, 121)
)
NO_THINK = "<think>\n\n</think>\n\n"
OPENTHOUGHTS_PREFIX = "Return your final response within \\boxed{}. "


def user(text):
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def answer(text):
    return f"{text}<|im_end|>\n"


EXPECTED = {
    "sftdatasetv3_sample": [
        user("Name three primary colors.") + answer(NO_THINK + "Red, yellow and blue."),
        "<|im_start|>system\nYou are a concise assistant.<|im_end|>\n"
        + user("Translate 'good morning' into French.")
        + answer(NO_THINK + "Bonjour."),
        # LLaMA-Factory's ReasoningTemplate adds the empty think block to every turn (Qwen3's own
        # template only to the last one): upstream behaviour, kept.
        user("What is 12 times 3?")
        + answer(NO_THINK + "36.")
        + user("And divided by 4?")
        + answer(NO_THINK + "36 divided by 4 is 9."),
        "empty response: message 1 ('assistant') is empty",
        "broken role order: message 0 has role 'assistant', expected one of ['user']",
    ],
    "openmathinstruct2_sample": [
        user("What is the value of $2^5 - 5^2$?")
        + answer(NO_THINK + "We have $2^5 = 32$ and $5^2 = 25$, so $2^5 - 5^2 = 32 - 25 = \\boxed{7}$."),
        user("Tom has 3 boxes with 12 pencils each. He gives away 10 pencils. How many pencils does he have left?")
        + answer(
            NO_THINK + "Tom starts with 3 * 12 = 36 pencils.\nAfter giving away 10 he has 36 - 10 = 26 pencils.\n"
            "So Tom has \\boxed{26} pencils left."
        ),
        "empty response: response column 'generated_solution' is empty",
        "empty text: prompt column 'problem' is empty",
    ],
    "openthoughts114k_sample": [
        user(OPENTHOUGHTS_PREFIX + "What is the sum of the interior angles of a hexagon?")
        + answer(
            "<think>\nA polygon with n sides has interior angles summing to (n - 2) * 180 degrees.\n\n"
            "For n = 6 that is 4 * 180 = 720.\n</think>\n\n"
            "The interior angles of a hexagon sum to \\boxed{720^\\circ}."
        ),
        user("Write a Python function that returns the largest element of a list.")
        + answer(
            "<think>\nUse the built-in max, and handle the empty list by raising ValueError as max does.\n</think>\n\n"
            "```python\ndef largest(items):\n    return max(items)\n```"
        ),
        "incomplete reasoning: '<|begin_of_thought|>' without '<|end_of_thought|>'",
    ],
    "openthoughts114k_math_sample": [
        user(OPENTHOUGHTS_PREFIX + "Prove that the product of two odd numbers is odd.")
        + answer(
            "<think>\nOdd numbers have the form 2a + 1.\n\n(2a + 1)(2b + 1) = 2(2ab + a + b) + 1.\n</think>\n\n"
            "The product equals 2(2ab + a + b) + 1, which is odd."
        ),
        user(OPENTHOUGHTS_PREFIX + "Solve for x: 2x + 3 = 11.")
        + answer("<think>\nSubtract 3: 2x = 8. Divide by 2: x = 4.\n</think>\n\n\\boxed{4}"),
        "empty response: no solution after '<|end_of_thought|>'",
    ],
    "openr1_math_220k_sample": [
        user("If 3x = 12, what is x?")
        + answer("<think>\nDivide both sides by 3.\nSo x = 4.\n</think>\n\nDividing by 3 gives $x = \\boxed{4}$."),
        user("How many edges does a cube have?")
        + answer(
            "<think>\nA cube has 4 edges on top, 4 on the bottom and 4 vertical ones.\n</think>\n\n"
            "A cube has $\\boxed{12}$ edges."
        ),
        "incomplete reasoning: '<think>' without '</think>'",
        "broken role order: messages column 'messages' ends with a 'user' turn, not an answer",
    ],
    "chatqa2_long_sft_sample": [
        "<|im_start|>system\nThis is a chat between a user and an artificial intelligence assistant. The assistant "
        "gives helpful, detailed, and polite answers to the user's questions based on the context.<|im_end|>\n"
        + user(
            "The museum opens at 9 am and closes at 5 pm on weekdays. On weekends it opens at 10 am.\n\n"
            "When does the museum open on Saturday?"
        )
        + answer(NO_THINK + "It opens at 10 am on Saturday."),
        user(f"{LIGHTHOUSE}\n\nHow many entries did the keeper write?") + answer(NO_THINK + "He wrote 120 entries."),
        "empty response: answer column 'answer' is empty",
    ],
    "chatqa2_narrativeqa_131k_sample": [
        user(
            "The fisherman found a bottle on the shore. Inside was a map that led him to an island where his "
            "grandfather had buried a chest of letters.\n\nWhat did the fisherman find inside the bottle?"
        )
        + answer(NO_THINK + "A map."),
        user(f"{LIGHTHOUSE}\n\nWhat did the keeper write down?")
        + answer(NO_THINK + "The wind, the tide and the ships he saw."),
        "empty response: answer column 'answer' is an empty list",
    ],
}


@pytest.fixture(scope="module")
def pipeline():
    tokenizer = build_tiny_tokenizer()
    data_args = DataArguments(template="qwen3", overwrite_cache=True)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    model_args = ModelArguments(model_name_or_path="unused")
    training_args = Seq2SeqTrainingArguments(output_dir="unused", report_to="none")
    return tokenizer, template, model_args, data_args, training_args


def _rendered(name, pipeline):
    tokenizer, template, model_args, data_args, training_args = pipeline
    (attr,) = parser_module.get_dataset_list([name], "no_dataset_dir")
    setattr(attr, REPORT_ATTRIBUTE, True)  # refused rows stay, as placeholders holding their reason
    rows = []
    for row in _load_single_dataset(attr, model_args, data_args, training_args):
        if row[DROP_REASON_COLUMN]:
            assert len(row["_prompt"]) % 2 == 0  # LLaMA-Factory's processors skip it
            rows.append(row[DROP_REASON_COLUMN])
            continue
        pairs = template.encode_multiturn(tokenizer, row["_prompt"] + row["_response"], row["_system"], row["_tools"])
        rows.append(tokenizer.decode([token for pair in pairs for part in pair for token in part]))
    return rows


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sample_rows_render_to_the_expected_qwen3_text(name, pipeline):
    assert _rendered(name, pipeline) == EXPECTED[name]


def test_thinking_can_be_switched_off_for_converted_traces(pipeline):
    tokenizer, template, *_ = pipeline
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>\nreasoning\n</think>\n\nfinal"},
    ]
    template.enable_thinking = False
    try:
        prompt, response = template.encode_oneturn(tokenizer, messages)
    finally:
        template.enable_thinking = True
    assert tokenizer.decode(prompt) == user("q") + NO_THINK
    assert tokenizer.decode(response) == answer("final")

import random

import pytest
from transformers import AutoTokenizer

from llamafactory_zebra.testing.tokenizer import (
    EOS_TOKEN,
    MARKUP_TOKENS,
    MAX_VOCAB_SIZE,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    build_tiny_tokenizer,
)


def _random_unicode_text(rng: random.Random, length: int) -> str:
    """Mixes ASCII, Latin-1, CJK, emoji, combining marks, controls and lone whitespace runs."""
    ranges = [(0x20, 0x7E), (0x00, 0x1F), (0xA0, 0x17F), (0x300, 0x36F), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF)]
    chars = []
    for _ in range(length):
        low, high = rng.choice(ranges)
        chars.append(chr(rng.randint(low, high)))
    return "".join(chars)


def test_vocab_is_small_and_holds_qwen3_special_tokens(tiny_tokenizer):
    assert len(tiny_tokenizer) <= MAX_VOCAB_SIZE
    assert tiny_tokenizer.eos_token == EOS_TOKEN == "<|im_end|>"
    assert tiny_tokenizer.pad_token == PAD_TOKEN == "<|endoftext|>"
    assert tiny_tokenizer.bos_token is None
    ids = set()
    for token in SPECIAL_TOKENS + MARKUP_TOKENS:
        encoded = tiny_tokenizer.encode(token, add_special_tokens=False)
        assert len(encoded) == 1, f"{token} split into {encoded}"
        ids.add(encoded[0])
    assert len(ids) == len(SPECIAL_TOKENS) + len(MARKUP_TOKENS)
    assert max(ids) < len(tiny_tokenizer)


def test_round_trips_arbitrary_utf8(tiny_tokenizer):
    rng = random.Random(0)
    samples = [_random_unicode_text(rng, rng.randint(1, 200)) for _ in range(50)]
    samples += ["", " ", "\n\n\n", "  leading and trailing  ", "tab\tand\r\nCRLF", "Zebra 🦓 斑马 зебра"]
    for text in samples:
        ids = tiny_tokenizer.encode(text, add_special_tokens=False)
        assert tiny_tokenizer.decode(ids) == text
        assert all(0 <= i < len(tiny_tokenizer) for i in ids)


def test_decode_skips_chatml_but_keeps_thinking_markers(tiny_tokenizer):
    text = "<|im_start|>assistant\n<think>\nr\n</think>\n\nanswer<|im_end|>"
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nr\n</think>\n\nanswer"


def test_build_is_deterministic(tiny_tokenizer):
    other = build_tiny_tokenizer()
    assert other.backend_tokenizer.to_str() == tiny_tokenizer.backend_tokenizer.to_str()


def test_save_and_reload_with_auto_tokenizer(tiny_tokenizer, tmp_path):
    tiny_tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(reloaded) == len(tiny_tokenizer)
    assert reloaded.eos_token_id == tiny_tokenizer.eos_token_id
    assert reloaded.pad_token_id == tiny_tokenizer.pad_token_id
    text = "Question: what is 3 + 4?\n<think>\nadd\n</think>\n\n7"
    assert reloaded.encode(text, add_special_tokens=False) == tiny_tokenizer.encode(text, add_special_tokens=False)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert reloaded.apply_chat_template(messages, tokenize=False) == tiny_tokenizer.apply_chat_template(
        messages, tokenize=False
    )


def test_chat_template_renders_qwen3_text(tiny_tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n5"},
    ]
    assert tiny_tokenizer.apply_chat_template(messages, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nadd them\n</think>\n\n5<|im_end|>\n"
    )
    prompt = tiny_tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")
    no_think = tiny_tokenizer.apply_chat_template(
        messages[:2], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize(
    ("system", "user", "assistant"),
    [
        ("Be brief.", "What is 2+3?", "<think>\nadd them\n</think>\n\n5"),
        (None, "Hi there", "Hello! How can I help?"),
        ("系统", "Long  spaced \n\n question\n", "<think>\nstep 1\n\nstep 2\n</think>\n\n The answer: 42.\n"),
    ],
)
def test_llamafactory_qwen3_template_gives_the_same_ids_as_apply_chat_template(
    tiny_tokenizer, system, user, assistant
):
    """Single-turn SFT rows: LLaMA-Factory encodes slot by slot, transformers the rendered string.

    (For earlier turns of a multi-turn chat LLaMA-Factory's ReasoningTemplate inserts an empty
    think block that Qwen3's own template leaves out; that is upstream behaviour, not checked here.)
    """
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments

    template = get_template_and_fix_tokenizer(tiny_tokenizer, DataArguments(template="qwen3"))
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    prompt_ids, response_ids = template.encode_oneturn(tiny_tokenizer, messages, system)
    chat = ([{"role": "system", "content": system}] if system else []) + messages
    expected = tiny_tokenizer.apply_chat_template(chat, tokenize=False)
    assert tiny_tokenizer.decode(prompt_ids + response_ids) == expected
    assert prompt_ids + response_ids == tiny_tokenizer.encode(expected, add_special_tokens=False)

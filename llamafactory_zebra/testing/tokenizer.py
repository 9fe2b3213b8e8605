"""A tiny, offline, Qwen3-compatible tokenizer for tests, examples and the quickstart.

The real Zebra checkpoints use Qwen3's 151,936-token vocabulary, which would make a toy model's
embedding dominate its parameter count and must be downloaded from the hub. This module trains a
byte-level BPE (the same pre-tokenizer regex and byte mapping as Qwen2/Qwen3) on a short built-in
text sample, so it is built in milliseconds without network access, stays under 1,024 tokens, and
round-trips any UTF-8 string. It carries Qwen3's special tokens and Qwen3's chat template, so
``tokenizer.apply_chat_template`` and LLaMA-Factory's ``qwen3`` template produce the same text and
the same token ids.
"""

from __future__ import annotations

from importlib import resources

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

MAX_VOCAB_SIZE = 1024

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
# Qwen3 marks the ChatML delimiters as special (skipped by ``decode(skip_special_tokens=True)``) and
# the reasoning/tool markers as ordinary added tokens (kept in decoded text, never split by BPE).
SPECIAL_TOKENS = (PAD_TOKEN, "<|im_start|>", EOS_TOKEN)
MARKUP_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# Qwen2/Qwen3's pre-tokenizer split: keeps newlines apart from words, so encoding a chat piece by
# piece (as LLaMA-Factory's templates do) gives the same ids as encoding the rendered string.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3's chat template (Apache-2.0, Qwen team), kept verbatim in a .jinja file next to this module so
# that thinking traces, tools and the ``enable_thinking`` switch render exactly as for Qwen3 checkpoints.
CHAT_TEMPLATE_FILE = "qwen3_chat_template.jinja"


def qwen3_chat_template() -> str:
    """Returns Qwen3's chat template as shipped in this package."""
    return resources.files(__package__).joinpath(CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")


# Training text for the merges: chat, math and long-document phrasing like the recipe's datasets,
# plus the bare ChatML role names, so common words become single tokens and toy sequences stay short.
_TRAINING_TEXT = """
The user asks a question and the assistant answers it. Think step by step before you answer.
You are a helpful assistant. Please answer the question based on the context below.
Question: What is the capital of France? Answer: The capital of France is Paris.
Question: Who wrote the story? Answer: The story was written by the author of the book.
Context: The river runs through the old town, and the bridge was built in the year 1820.
The document describes the history of the city, its people, their work and the long winter.
Solve the problem. Let x be the number of apples. Then 3x + 5 = 20, so 3x = 15 and x = 5.
The answer is \\boxed{5}. We compute the sum of the first n integers: n(n + 1) / 2.
Problem: Find all real numbers x such that x^2 - 4x + 4 = 0. Solution: (x - 2)^2 = 0, so x = 2.
Let me check the result again. First, second, third, therefore, because, since, which, where.
def add(a, b):
    return a + b
for i in range(10):
    print(i)
import json
data = {"name": "value", "items": [1, 2, 3]}
Summarize the following text in one sentence. Translate the sentence into French.
Write a short poem about the sea. Explain why the sky is blue. Give three examples.
The model reads a long context of many thousands of tokens and finds the relevant passage.
In the beginning of the chapter, the narrator remembers the house where she was born.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14 1/2 50% = + - * / ( ) [ ] { } < > .
system
user
assistant
system
user
assistant
"""


def _train_byte_level_bpe() -> Tokenizer:
    """Trains the merges on the built-in text; the 256-byte alphabet guarantees lossless round trips."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=MAX_VOCAB_SIZE - len(SPECIAL_TOKENS) - len(MARKUP_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_TRAINING_TEXT.splitlines(keepends=True), trainer=trainer)
    return tokenizer


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Builds the tiny tokenizer (deterministic, no network); ``len()`` of the result is the model vocab.

    Save it with ``save_pretrained(dir)``; ``AutoTokenizer.from_pretrained(dir)`` reloads it.
    """
    backend = _train_byte_level_bpe()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[SPECIAL_TOKENS[1]],
        model_max_length=1_048_576,
        clean_up_tokenization_spaces=False,
        chat_template=qwen3_chat_template(),
    )
    tokenizer.add_tokens(list(MARKUP_TOKENS), special_tokens=False)
    if len(tokenizer) > MAX_VOCAB_SIZE:
        raise RuntimeError(f"tiny tokenizer has {len(tokenizer)} tokens, more than {MAX_VOCAB_SIZE}")
    return tokenizer

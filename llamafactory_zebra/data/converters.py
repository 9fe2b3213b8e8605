"""LLaMA-Factory dataset converters for the recipe schemas its alpaca/sharegpt/openai formats miss.

Registered under ``formatting`` names through LLaMA-Factory's own ``register_dataset_converter``
(see ``integration/datasets.py``); each turns a row into LLaMA-Factory's aligned form
(``_prompt``/``_response``/``_system``...). Reasoning traces are rewritten into the assistant turn
exactly as Qwen3's chat template renders them, ``<think>\\n{reasoning}\\n</think>\\n\\n{answer}``,
which is also the ``thought_words`` pair of LLaMA-Factory's ``qwen3`` template: so
``enable_thinking: false`` strips them and the trained text matches ``apply_chat_template``.

- ``zebra_chatqa2``: ChatQA2's ``question`` (context and question in one string, framed as
  ``[System: ...]\\n\\nUser: ...\\n\\nAssistant:``) and ``answer`` (a string or a list of strings).
- ``zebra_openthoughts``: OpenThoughts' ``<|begin_of_thought|>``/``<|begin_of_solution|>`` markers.
- ``zebra_reasoning_messages``: role/content messages whose answers may hold ``<think>`` blocks
  (OpenR1-Math); the blocks are normalised to Qwen3's spacing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from llamafactory.data.converter import DatasetConverter
from llamafactory.data.data_utils import Role

from .validation import DropRow, optional_text, read_conversation, required_text

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
THOUGHT_OPEN, THOUGHT_CLOSE = "<|begin_of_thought|>", "<|end_of_thought|>"
SOLUTION_OPEN, SOLUTION_CLOSE = "<|begin_of_solution|>", "<|end_of_solution|>"


def format_thinking(reasoning: str, answer: str) -> str:
    """Qwen3's rendering of an assistant turn with reasoning (newlines trimmed as its template does)."""
    return f"{THINK_OPEN}\n{reasoning.strip(chr(10))}\n{THINK_CLOSE}\n\n{answer.lstrip(chr(10))}"


def normalize_thinking(content: str) -> str:
    """Re-spaces a ``<think>...</think>`` answer the way Qwen3's template splits it; plain text passes."""
    if THINK_CLOSE not in content:
        if THINK_OPEN in content:
            raise DropRow("incomplete reasoning", f"'{THINK_OPEN}' without '{THINK_CLOSE}'")
        return content
    parts = content.split(THINK_CLOSE)
    reasoning = parts[0].rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
    answer = parts[-1].lstrip("\n")
    if not answer.strip():
        raise DropRow("empty response", f"no answer after '{THINK_CLOSE}'")
    return format_thinking(reasoning, answer)


def openthoughts_to_thinking(content: str) -> str:
    """``<|begin_of_thought|>T<|end_of_thought|><|begin_of_solution|>S<|end_of_solution|>`` -> think block."""
    if THOUGHT_OPEN not in content:
        return normalize_thinking(content)
    after_open = content.partition(THOUGHT_OPEN)[2]
    if THOUGHT_CLOSE not in after_open:
        raise DropRow("incomplete reasoning", f"'{THOUGHT_OPEN}' without '{THOUGHT_CLOSE}'")
    thought, _, after_thought = after_open.partition(THOUGHT_CLOSE)
    solution = after_thought
    if SOLUTION_OPEN in after_thought:
        solution = after_thought.partition(SOLUTION_OPEN)[2].partition(SOLUTION_CLOSE)[0]
    if not solution.strip():
        raise DropRow("empty response", f"no solution after '{THOUGHT_CLOSE}'")
    return format_thinking(thought.strip(), solution.strip())


def split_chatqa_prompt(question: str) -> tuple[str, str]:
    """Splits ChatQA's ``[System: s]\\n\\nUser: q\\n\\nAssistant:`` framing into (system, user text)."""
    text = question.strip()
    if text.endswith("Assistant:"):
        text = text[: -len("Assistant:")].rstrip()
    system = ""
    if text.startswith("System:"):
        head, separator, rest = text.partition("\n\nUser:")
        if separator:
            system, text = head[len("System:") :].strip(), rest.strip()
    elif text.startswith("User:"):
        text = text[len("User:") :].strip()
    if not text:
        raise DropRow("empty text", "the question holds nothing besides its 'User:'/'Assistant:' framing")
    return system, text


def first_answer(value: Any, column: str) -> str:
    """ChatQA2 answers are a string or a list of reference answers; training uses the first non-empty one."""
    if isinstance(value, list):
        if not value:
            raise DropRow("empty response", f"answer column '{column}' is an empty list")
        for item in value:
            if isinstance(item, str) and item.strip():
                return item.strip()
        if not all(isinstance(item, str) for item in value):
            raise DropRow("wrong type", f"answer column '{column}' must hold strings")
        raise DropRow("empty response", f"every answer in column '{column}' is empty")
    return required_text(value, f"answer column '{column}'", "empty response").strip()


def _aligned(prompt: list[dict[str, str]], response: list[dict[str, str]], system: str) -> dict[str, Any]:
    return {
        "_prompt": prompt,
        "_response": response,
        "_system": system,
        "_tools": "",
        "_images": None,
        "_videos": None,
        "_audios": None,
    }


@dataclass
class ChatQA2Converter(DatasetConverter):
    required_fields: ClassVar[tuple[str, ...]] = ("prompt", "response", "system")

    def __call__(self, example: dict[str, Any]) -> dict[str, Any]:
        attr = self.dataset_attr
        question = required_text(example.get(attr.prompt), f"question column '{attr.prompt}'", "empty text")
        framed_system, user_text = split_chatqa_prompt(question)
        answer = first_answer(example.get(attr.response), attr.response)
        system = optional_text(example, attr.system, "system") or framed_system
        return _aligned(
            [{"role": Role.USER.value, "content": user_text}],
            [{"role": Role.ASSISTANT.value, "content": answer}],
            system,
        )


@dataclass
class _ConversationConverter(DatasetConverter):
    """Role/content conversations checked by ``read_conversation``; subclasses rewrite the answers."""

    required_fields: ClassVar[tuple[str, ...]] = ("messages", "system")

    def rewrite_answer(self, content: str) -> str:
        raise NotImplementedError

    def rewrite_system(self, system: str) -> str:
        return system

    def __call__(self, example: dict[str, Any]) -> dict[str, Any]:
        attr = self.dataset_attr
        system, turns = read_conversation(example, attr)
        roles = {
            attr.user_tag: Role.USER.value,
            attr.assistant_tag: Role.ASSISTANT.value,
            attr.observation_tag: Role.OBSERVATION.value,
            attr.function_tag: Role.FUNCTION.value,
        }
        messages = []
        for tag, content in turns:
            role = roles[tag]
            if role == Role.ASSISTANT.value:
                content = self.rewrite_answer(content)
            messages.append({"role": role, "content": content})
        return _aligned(messages[:-1], messages[-1:], self.rewrite_system(system))


@dataclass
class OpenThoughtsConverter(_ConversationConverter):
    def rewrite_answer(self, content: str) -> str:
        return openthoughts_to_thinking(content)

    def rewrite_system(self, system: str) -> str:
        # OpenThoughts' system prompt only explains the thought/solution markers rewritten above.
        return "" if THOUGHT_OPEN in system else system


@dataclass
class ReasoningMessagesConverter(_ConversationConverter):
    def rewrite_answer(self, content: str) -> str:
        return normalize_thinking(content)


ZEBRA_CONVERTERS: dict[str, type[DatasetConverter]] = {
    "zebra_chatqa2": ChatQA2Converter,
    "zebra_openthoughts": OpenThoughtsConverter,
    "zebra_reasoning_messages": ReasoningMessagesConverter,
}

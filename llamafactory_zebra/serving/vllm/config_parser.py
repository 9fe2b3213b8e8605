"""How vLLM reads a Zebra checkpoint's configuration, in either layout.

A native checkpoint's ``config.json`` says ``model_type: zebra``; vLLM's ``HFConfigParser`` hands it to
transformers' ``AutoConfig``, which knows ``zebra`` once the package is imported (``llamafactory_zebra``
registers it, before this module's first line runs).

AMD's released layout is a Qwen3 ``config.json`` plus ``hybrid_config.json``; read as it is, vLLM would
build a plain Qwen3 and fail on the MLA/GDN weights. vLLM has exactly one mechanism for "this
directory's config is read differently": a config parser (``register_config_parser``). Parsers are chosen
by ``config_format``, and ``auto`` picks ``hf`` for any directory with a ``config.json`` — a parser under a
new name would need ``--config-format zebra`` on every command. So :class:`ZebraAwareHFConfigParser`
is registered under the name ``hf`` itself: it answers released-layout directories with the
``ZebraConfig`` of ``released.load_released_config`` (the loader ``ZebraForCausalLM.from_pretrained``
calls, so both sides read one translation) and passes every other directory to vLLM's own
``HFConfigParser`` unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PreTrainedConfig
from vllm.transformers_utils.config import HFConfigParser, register_config_parser

from ...configuration_zebra import ZebraConfig
from ...released import RELEASED_LAYOUT, checkpoint_layout, load_released_config

ARCHITECTURE = "ZebraForCausalLM"


def released_config(path: str) -> ZebraConfig:
    """The ``ZebraConfig`` the training side reads from a released-layout directory, naming the vLLM
    architecture (AMD's ``config.json`` names Qwen3's)."""
    config = load_released_config(path)
    config.architectures = [ARCHITECTURE]
    return config


class ZebraAwareHFConfigParser(HFConfigParser):
    """vLLM's ``hf`` parser, plus AMD's released Zebra layout (see the module docstring)."""

    def parse(
        self,
        model: str | Path,
        trust_remote_code: bool,
        revision: str | None = None,
        code_revision: str | None = None,
        **kwargs: Any,
    ) -> tuple[dict, PreTrainedConfig]:
        if checkpoint_layout(str(model)) == RELEASED_LAYOUT:
            config = released_config(str(model))
            return config.to_dict(), config
        return super().parse(model, trust_remote_code, revision=revision, code_revision=code_revision, **kwargs)


def register_config_parser_for_released_layout() -> None:
    register_config_parser("hf")(ZebraAwareHFConfigParser)

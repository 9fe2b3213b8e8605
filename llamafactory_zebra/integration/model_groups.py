"""Zebra checkpoints as LLaMA-Factory model groups (web UI dropdown and default template).

LLaMA-Factory assigns a group's template only to names containing ``-Instruct``/``-Chat``/``-Distill``/
``-Thinking``; all released Zebra/HyLo checkpoints are chat-tuned, hence the ``-Instruct`` names. AMD's
tooling now calls the models HyLo, so the 1M checkpoint is listed under both names (the 64K and 8K ones
were released as HyLo).
"""

from ..presets import PRESET_HUB_IDS

MODEL_GROUPS: list[dict[str, str]] = [
    {
        "Zebra-Qwen3-1.7B-7MLA21GDN-1M-Instruct": PRESET_HUB_IDS["qwen3-1.7b-7mla21gdn-1m"],
        "HyLo-Qwen3-1.7B-7MLA21GDN-1M-Instruct": PRESET_HUB_IDS["qwen3-1.7b-7mla21gdn-1m"],
        "HyLo-Qwen3-1.7B-7MLA21GDN-64K-Instruct": PRESET_HUB_IDS["qwen3-1.7b-7mla21gdn-64k"],
        "HyLo-Qwen3-1.7B-7MLA21GDN-8K-Instruct": PRESET_HUB_IDS["qwen3-1.7b-7mla21gdn-8k"],
    },
]

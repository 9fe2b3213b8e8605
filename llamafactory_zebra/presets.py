"""The shapes of AMD's released Zebra checkpoints, and ``tiny`` for CPU work, by name.

``ZebraConfig.from_preset(name, **overrides)`` builds a config from this table (``preset_values`` is
its logic); the parameter counts each shape gives are in ``docs/architecture.md``. The layer plans are
written as ``mla_layers`` (the indices of the MLA layers, everything else GDN), the spelling of AMD's
``hybrid_config.json``, so this module is plain data and imports nothing from the package.

AMD's tooling now calls these models HyLo (AMD-AGI/Primus renamed its ``zebra_*`` configs ``hylo_*``), so
wherever a preset is named (``init``, ``from_preset``, the planner's ``model_name_or_path``)
:func:`preset_name` also takes a ``hylo-``/``zebra-`` prefix, any case, ``_`` for ``-``, and AMD's hub ids.
"""

from __future__ import annotations

import copy
from typing import Any

# Hub ids of the checkpoints each preset describes (kept for users who have internet).
PRESET_HUB_IDS = {
    "qwen3-1.7b-7mla21gdn-1m": "amd/zebra_qwen3_7MLA21GDN_noT_SFT_1M_combined_fCE",
    "qwen3-1.7b-7mla21gdn-64k": "amd/HyLo-Qwen-7MLA21GDN-64K",
    "qwen3-1.7b-7mla21gdn-8k": "amd/HyLo-Qwen-7MLA21GDN-8K",
}

# The Qwen3-1.7B decoder every released hybrid keeps (its mixers aside).
QWEN3_1_7B = {
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}

# MLA at layers 1, 5, 9, …: the 7MLA21GDN plan of the released 28-layer hybrids.
EVERY_FOURTH_FROM_ONE = list(range(1, 28, 4))


def _yarn(factor: float, original: int = 32768) -> dict[str, Any]:
    return {
        "rope_type": "yarn",
        "rope_theta": 1_000_000.0,
        "factor": factor,
        "original_max_position_embeddings": original,
    }


PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-1.7b-7mla21gdn-1m": {
        **QWEN3_1_7B,
        "mla_layers": EVERY_FOURTH_FROM_ONE,
        "max_position_embeddings": 1_048_576,
        "rope_parameters": _yarn(32.0),
    },
    "qwen3-1.7b-7mla21gdn-64k": {
        **QWEN3_1_7B,
        "mla_layers": EVERY_FOURTH_FROM_ONE,
        "max_position_embeddings": 65_536,
        "rope_parameters": _yarn(2.0),
    },
    "qwen3-1.7b-7mla21gdn-8k": {
        **QWEN3_1_7B,
        "mla_layers": EVERY_FOURTH_FROM_ONE,
        "max_position_embeddings": 32_768,
    },
    "qwen3-1.7b-14mla14gdn": {
        **QWEN3_1_7B,
        "mla_layers": list(range(0, 28, 2)),
        "max_position_embeddings": 32_768,
    },
    # Both mixers, every code path, a few hundred thousand parameters: CPU tests and the quickstart.
    "tiny": {
        "vocab_size": 1024,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "mla_layers": [1],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "gdn_num_heads": 2,
        "gdn_head_dim": 32,
        "max_position_embeddings": 4096,
        "bos_token_id": None,
        "eos_token_id": None,
    },
    # The long-context quickstart's model: the released 1:3 MLA:GDN plan (a GDN layer before the MLA one: its
    # short convolution hands each position its previous tokens), positions to 16K, and latent ranks as wide
    # as the hidden size: ``tiny``'s 48/32-rank latents learn to copy far more slowly at this width.
    "tiny-16k": {
        "vocab_size": 1024,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "mla_layers": [1],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "q_lora_rank": 128,
        "kv_lora_rank": 128,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 32,
        "v_head_dim": 32,
        "gdn_num_heads": 2,
        "gdn_head_dim": 64,
        "max_position_embeddings": 16384,
        "bos_token_id": None,
        "eos_token_id": None,
    },
}

# Presets small enough for a CPU: ``init`` writes them without --allow-large, with the tiny tokenizer's vocab.
CPU_PRESETS = ("tiny", "tiny-16k")

# Overrides that replace the preset's layer plan rather than add to it.
_PLAN_KEYS = ("layer_types", "layers_block_type", "mla_layers")


# The prefixes AMD's names put before a shape: HyLo (current), Zebra (the papers', the first checkpoints').
NAME_PREFIXES = ("hylo", "zebra")


def preset_name(name: str) -> str:
    """The preset ``name`` means: a preset, an AMD hub id, or either with AMD's spellings.

    >>> preset_name("HyLo_Qwen3_1.7B_7MLA21GDN_64K"), preset_name("zebra-tiny")
    ('qwen3-1.7b-7mla21gdn-64k', 'tiny')
    >>> preset_name("amd/HyLo-Qwen-7MLA21GDN-8K")
    'qwen3-1.7b-7mla21gdn-8k'
    """
    by_hub_id = {hub_id: preset for preset, hub_id in PRESET_HUB_IDS.items()}
    if name in by_hub_id:
        return by_hub_id[name]
    key = name.strip().lower().replace("_", "-")
    for prefix in NAME_PREFIXES:
        key = key.removeprefix(f"{prefix}-")
    if key not in PRESETS:
        raise ValueError(
            f"Unknown Zebra preset {name!r}; known presets: {', '.join(sorted(PRESETS))} (also with a hylo- or "
            f"zebra- prefix), or one of AMD's hub ids: {', '.join(sorted(by_hub_id))}"
        )
    return key


def preset_values(name: str, **overrides: Any) -> dict[str, Any]:
    """``ZebraConfig`` keyword arguments of preset ``name`` with ``overrides`` applied.

    A plan given as an override (``layer_types``, ``layers_block_type`` or ``mla_layers``) replaces the
    preset's ``mla_layers`` instead of competing with it.

    >>> preset_values("tiny", num_hidden_layers=2, layer_types=["gdn", "mla"])["layer_types"]
    ['gdn', 'mla']
    >>> "mla_layers" in preset_values("tiny", layer_types=["gdn", "mla", "gdn", "gdn"])
    False
    """
    values = copy.deepcopy(PRESETS[preset_name(name)])
    if any(key in overrides for key in _PLAN_KEYS):
        values.pop("mla_layers")
    values.update(overrides)
    return values

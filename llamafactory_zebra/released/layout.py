"""Which layout a checkpoint directory is in, and AMD's released layout read as a ``ZebraConfig``.

AMD publishes Qwen3's ``config.json`` (``model_type: qwen3``) plus a ``hybrid_config.json`` that holds
the layer plan; ``save_pretrained`` writes the native layout (``model_type: zebra``). transformers reads
AMD's ``config.json`` as the Qwen3 model it describes, so the translation happens here, and
``ZebraForCausalLM.from_pretrained`` and LLaMA-Factory's loader (through the plugin) call it.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from ..configuration_zebra import MLA_NORM_LORA, MLA_NORM_QK_HEAD, ZebraConfig, layer_types_from_mla_indices
from .keys import detect_mla_norm

logger = logging.getLogger(__name__)

RELEASED_HYBRID_CONFIG = "hybrid_config.json"
NATIVE_LAYOUT = "native"
RELEASED_LAYOUT = "released"

# Files copied verbatim next to the weights when a checkpoint is rewritten (import, convert).
TOKENIZER_AND_GENERATION_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
)

# Fields of hybrid_config.json that name a ZebraConfig attribute directly.
_HYBRID_FIELD_MAP = {
    "q_lora_rank": "q_lora_rank",
    "kv_lora_rank": "kv_lora_rank",
    "qk_rope_head_dim": "qk_rope_head_dim",
    "qk_nope_head_dim": "qk_nope_head_dim",
    "v_head_dim": "v_head_dim",
    "gdn_num_heads": "gdn_num_heads",
    "gdn_head_dim": "gdn_head_dim",
    "gdn_expand_v": "gdn_expand_v",
    "gdn_conv_size": "gdn_conv_size",
    "conv_size": "gdn_conv_size",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "max_position_embeddings": "max_position_embeddings",
}
_QWEN3_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_act",
    "max_position_embeddings",
    "initializer_range",
    "rms_norm_eps",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "attention_bias",
    "attention_dropout",
)
# hybrid_config.json keys that describe the recipe rather than the architecture, or are read explicitly.
_HYBRID_IGNORED = {
    "linear_type",
    "mla_layers",
    "rope_scaling",
    "rope_theta",
    "model_type",
    "architectures",
    "use_lora_layer_norm",
    "use_full_kv_head",
}


def checkpoint_layout(path: str | os.PathLike | None) -> str | None:
    """Whether a local directory holds a Zebra checkpoint, and in which layout.

    ``RELEASED_LAYOUT`` for AMD's (Qwen3's ``config.json`` plus a ``hybrid_config.json``), ``NATIVE_LAYOUT``
    for a ``config.json`` with ``model_type: zebra`` (what ``save_pretrained`` writes), ``None`` for
    anything else: no path, not a directory, another model. Every tool that must tell a Zebra
    checkpoint from another one asks this function.
    """
    if not path or not os.path.isdir(path):
        return None
    if os.path.isfile(os.path.join(path, RELEASED_HYBRID_CONFIG)):
        return RELEASED_LAYOUT
    config_file = os.path.join(path, "config.json")
    if os.path.isfile(config_file):
        with open(config_file, encoding="utf-8") as f:
            if json.load(f).get("model_type") == ZebraConfig.model_type:
                return NATIVE_LAYOUT
    return None


def released_layout_to_kwargs(base_config: dict[str, Any], hybrid_config: dict[str, Any]) -> dict[str, Any]:
    """ZebraConfig keyword arguments for AMD's layout (files only; ``released_directory_kwargs`` also reads
    the weights' key names for the MLA norm placement).

    AMD's code decides some things the files do not say: RoPE rotates interleaved pairs
    (``rope_interleave: true``), the head is untied whatever Qwen3's ``tie_word_embeddings`` says (the
    published parameter counts need it), and with YaRN the context is ``original × factor`` (the
    ``max_position_embeddings`` in the files is Qwen3's 40960).
    """
    if hybrid_config.get("linear_type", "gdn") != "gdn":
        raise ValueError(
            f"{RELEASED_HYBRID_CONFIG}: linear_type {hybrid_config['linear_type']!r} is not supported; "
            "only 'gdn' (Gated DeltaNet) hybrids are Zebra models"
        )
    if "mla_layers" not in hybrid_config:
        raise ValueError(f"{RELEASED_HYBRID_CONFIG}: missing 'mla_layers' (the indices of the MLA layers)")
    num_layers = hybrid_config.get("num_hidden_layers", base_config.get("num_hidden_layers"))
    if not isinstance(num_layers, int):
        raise ValueError("config.json: missing integer 'num_hidden_layers'")
    try:
        layer_types = layer_types_from_mla_indices(hybrid_config["mla_layers"], num_layers)
    except ValueError as error:
        raise ValueError(f"{RELEASED_HYBRID_CONFIG}: {error}") from None
    kwargs: dict[str, Any] = {key: base_config[key] for key in _QWEN3_FIELDS if key in base_config}
    if "torch_dtype" in base_config or "dtype" in base_config:
        kwargs["dtype"] = base_config.get("dtype", base_config.get("torch_dtype"))
    kwargs["num_hidden_layers"] = num_layers
    kwargs["layer_types"] = layer_types
    kwargs["tie_word_embeddings"] = False
    kwargs["rope_interleave"] = True
    for source, target in _HYBRID_FIELD_MAP.items():
        if source in hybrid_config:
            kwargs[target] = hybrid_config[source]
    kwargs["mla_norm"] = MLA_NORM_LORA if hybrid_config.get("use_lora_layer_norm") else MLA_NORM_QK_HEAD
    if hybrid_config.get("use_full_kv_head"):
        # AMD's MLA then expands the latent to every query head: K/V heads = query heads.
        kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", ZebraConfig.num_attention_heads)
    rope_theta = hybrid_config.get("rope_theta", base_config.get("rope_theta", 1_000_000.0))
    rope = hybrid_config.get("rope_scaling") or base_config.get("rope_scaling")
    if rope:
        rope = dict(rope)
        if "type" in rope and "rope_type" not in rope:
            rope["rope_type"] = rope.pop("type")
        rope.setdefault("rope_theta", rope_theta)
        kwargs["rope_parameters"] = rope
        if rope.get("rope_type") == "yarn" and "original_max_position_embeddings" in rope and "factor" in rope:
            kwargs["max_position_embeddings"] = int(rope["original_max_position_embeddings"] * rope["factor"])
    else:
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": rope_theta}
    unknown = sorted(set(hybrid_config) - set(_HYBRID_FIELD_MAP) - _HYBRID_IGNORED - set(_QWEN3_FIELDS))
    if unknown:
        logger.warning("%s: ignoring fields Zebra does not use: %s", RELEASED_HYBRID_CONFIG, ", ".join(unknown))
    return kwargs


def released_directory_kwargs(path: str | os.PathLike) -> dict[str, Any]:
    """``released_layout_to_kwargs`` for a directory, with ``mla_norm`` decided by the weights' MLA keys."""
    kwargs = released_layout_to_kwargs(*_read_released_files(path))
    stated = kwargs["mla_norm"]
    detected = detect_mla_norm(path, ZebraConfig(**kwargs))
    if detected is not None:
        if detected == MLA_NORM_QK_HEAD and stated == MLA_NORM_LORA:
            raise ValueError(
                f"{path}: {RELEASED_HYBRID_CONFIG} sets use_lora_layer_norm but the weights carry q_norm/k_norm "
                "(mla_norm 'qk_head'), not q_a_layernorm/kv_a_layernorm"
            )
        kwargs["mla_norm"] = detected
    return kwargs


def _read_released_files(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        base = json.load(f)
    with open(os.path.join(path, RELEASED_HYBRID_CONFIG), encoding="utf-8") as f:
        hybrid = json.load(f)
    return base, hybrid


def load_released_config(path: str | os.PathLike, **overrides: Any) -> ZebraConfig:
    """Read a released-layout directory (``config.json`` + ``hybrid_config.json`` + the weights' key names);
    ``overrides`` are further ``ZebraConfig`` fields, validated with the rest."""
    config = ZebraConfig(**{**released_directory_kwargs(path), **overrides})
    config._name_or_path = os.fspath(path)
    return config


def load_checkpoint_config(path: str | os.PathLike) -> ZebraConfig:
    """The config of a local Zebra checkpoint in either layout (``checkpoint_layout`` must not be ``None``)."""
    layout = checkpoint_layout(path)
    if layout == RELEASED_LAYOUT:
        return load_released_config(path)
    if layout == NATIVE_LAYOUT:
        return ZebraConfig.from_pretrained(path)
    raise ValueError(
        f"{path}: not a Zebra checkpoint (expected a config.json with model_type {ZebraConfig.model_type!r}, "
        f"or AMD's layout with a {RELEASED_HYBRID_CONFIG})"
    )

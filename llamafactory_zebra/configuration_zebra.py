"""Configuration of the Zebra hybrids: Qwen3 decoders whose token mixers are MLA or Gated DeltaNet.

The numbers of the released checkpoints are in ``docs/architecture.md``; ``from_preset`` reproduces
them, and ``from_released`` translates the layout AMD published (a Qwen3 ``config.json`` plus a
``hybrid_config.json`` that holds the layer plan) into a native ``ZebraConfig``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig, configuration_utils

logger = logging.getLogger(__name__)

MLA = "mla"
GDN = "gdn"
LAYER_TYPES = (MLA, GDN)

# transformers validates every config's layer_types against one module-level tuple, including where it
# reads a checkpoint's config.json through the base class (Trainer's resume_from_checkpoint). Zebra's
# layer names join that list, as a model type joins AutoConfig.
configuration_utils.ALLOWED_LAYER_TYPES = tuple(
    dict.fromkeys((*configuration_utils.ALLOWED_LAYER_TYPES, *LAYER_TYPES))
)

RELEASED_HYBRID_CONFIG = "hybrid_config.json"

# Hub ids of the checkpoints each preset describes (kept for users who have internet).
PRESET_HUB_IDS = {
    "qwen3-1.7b-7mla21gdn-1m": "amd/zebra_qwen3_7MLA21GDN_noT_SFT_1M_combined_fCE",
    "qwen3-1.7b-7mla21gdn-64k": "amd/HyLo-Qwen-7MLA21GDN-64K",
    "qwen3-1.7b-7mla21gdn-8k": "amd/HyLo-Qwen-7MLA21GDN-8K",
}

_QWEN3_1_7B = {
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


def _every_fourth_from_one(num_layers: int) -> list[str]:
    return [MLA if i % 4 == 1 else GDN for i in range(num_layers)]


def _even_indices(num_layers: int) -> list[str]:
    return [MLA if i % 2 == 0 else GDN for i in range(num_layers)]


def _layer_types_from_mla_indices(mla_layers: Any, num_layers: int) -> list[str]:
    """``mla_layers=[1, 5, ...]`` is the released configs' spelling of the plan; everything else is GDN."""
    if not isinstance(mla_layers, list | tuple) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in mla_layers
    ):
        raise ValueError(f"ZebraConfig.mla_layers: must be a list of layer indices, got {mla_layers!r}")
    out_of_range = [i for i in mla_layers if not 0 <= i < num_layers]
    if out_of_range:
        raise ValueError(
            f"ZebraConfig.mla_layers: indices {out_of_range} are out of range for num_hidden_layers={num_layers} "
            f"(valid: 0..{num_layers - 1})"
        )
    return [MLA if i in set(mla_layers) else GDN for i in range(num_layers)]


def _yarn(factor: float, original: int = 32768) -> dict[str, Any]:
    return {
        "rope_type": "yarn",
        "rope_theta": 1_000_000.0,
        "factor": factor,
        "original_max_position_embeddings": original,
    }


PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-1.7b-7mla21gdn-1m": {
        **_QWEN3_1_7B,
        "layer_types": _every_fourth_from_one(28),
        "max_position_embeddings": 1_048_576,
        "rope_parameters": _yarn(32.0),
    },
    "qwen3-1.7b-7mla21gdn-64k": {
        **_QWEN3_1_7B,
        "layer_types": _every_fourth_from_one(28),
        "max_position_embeddings": 65_536,
        "rope_parameters": _yarn(2.0),
    },
    "qwen3-1.7b-7mla21gdn-8k": {
        **_QWEN3_1_7B,
        "layer_types": _every_fourth_from_one(28),
        "max_position_embeddings": 32_768,
    },
    "qwen3-1.7b-14mla14gdn": {
        **_QWEN3_1_7B,
        "layer_types": _even_indices(28),
        "max_position_embeddings": 32_768,
    },
    # Both mixers, every code path, a few hundred thousand parameters: CPU tests and the quickstart.
    "tiny": {
        "vocab_size": 1024,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "layer_types": _every_fourth_from_one(4),
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
}


@strict
class ZebraConfig(PreTrainedConfig):
    r"""Zebra hybrid decoder: Qwen3 blocks whose token mixer is MLA or Gated DeltaNet per ``layer_types``.

    MLA layers use ``num_attention_heads`` query heads and ``num_key_value_heads`` key/value heads
    expanded from a ``kv_lora_rank`` latent, with RoPE on ``qk_rope_head_dim`` dims only (YaRN settings
    in ``rope_parameters`` apply there). GDN layers carry no positions; their state is
    ``gdn_num_heads × gdn_head_dim × gdn_head_dim·gdn_expand_v`` per sequence.
    ``head_dim`` is set to ``qk_rope_head_dim`` because transformers' RoPE initialisers read it.
    """

    model_type = "zebra"
    keys_to_ignore_at_inference = ["past_key_values"]
    base_model_pp_plan = {
        "embed_tokens": (["input_ids"], ["inputs_embeds"]),
        "layers": (["hidden_states", "attention_mask"], ["hidden_states"]),
        "norm": (["hidden_states"], ["hidden_states"]),
    }

    vocab_size: int = 151936
    hidden_size: int = 2048
    intermediate_size: int = 6144
    num_hidden_layers: int = 28
    layer_types: list[str] | None = None
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    q_lora_rank: int | None = 1344
    kv_lora_rank: int = 256
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    gdn_num_heads: int = 6
    gdn_head_dim: int = 256
    gdn_expand_v: int = 2
    gdn_conv_size: int = 4
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    use_cache: bool = True
    tie_word_embeddings: bool = False
    rope_parameters: dict | None = None
    attention_bias: bool = False
    attention_dropout: float = 0.0
    pad_token_id: int | None = None
    bos_token_id: int | None = 151643
    eos_token_id: int | list[int] | None = 151645

    def __post_init__(self, **kwargs):
        mla_layers = kwargs.pop("mla_layers", None)
        if mla_layers is not None:
            self.layer_types = _layer_types_from_mla_indices(mla_layers, self.num_hidden_layers)
        if self.layer_types is None:
            self.layer_types = _every_fourth_from_one(self.num_hidden_layers)
        if self.rope_parameters is None and "rope_scaling" not in kwargs:
            self.rope_parameters = {"rope_type": "default", "rope_theta": kwargs.pop("rope_theta", 1_000_000.0)}
        self.qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        self.head_dim = self.qk_rope_head_dim
        super().__post_init__(**kwargs)
        self._validate_zebra()

    @property
    def mla_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == MLA]

    @property
    def gdn_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == GDN]

    @property
    def gdn_head_v_dim(self) -> int:
        return self.gdn_head_dim * self.gdn_expand_v

    @property
    def num_key_value_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def _validate_zebra(self) -> None:
        def fail(field: str, message: str) -> None:
            raise ValueError(f"ZebraConfig.{field}: {message}")

        for field in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "gdn_num_heads",
            "gdn_head_dim",
            "gdn_expand_v",
            "gdn_conv_size",
        ):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                fail(field, f"must be a positive integer, got {value!r}")
        if self.q_lora_rank is not None and (not isinstance(self.q_lora_rank, int) or self.q_lora_rank <= 0):
            fail("q_lora_rank", f"must be a positive integer or null, got {self.q_lora_rank!r}")
        if not isinstance(self.layer_types, list | tuple):
            fail("layer_types", f"must be a list of {LAYER_TYPES}, got {self.layer_types!r}")
        self.layer_types = list(self.layer_types)
        if len(self.layer_types) != self.num_hidden_layers:
            fail(
                "layer_types",
                f"has {len(self.layer_types)} entries but num_hidden_layers is {self.num_hidden_layers}",
            )
        for index, layer_type in enumerate(self.layer_types):
            if layer_type not in LAYER_TYPES:
                fail("layer_types", f"entry {index} is {layer_type!r}; each entry must be one of {LAYER_TYPES}")
        if self.num_attention_heads % self.num_key_value_heads:
            fail(
                "num_key_value_heads",
                f"{self.num_key_value_heads} does not divide num_attention_heads={self.num_attention_heads}",
            )
        if self.qk_rope_head_dim % 2:
            fail("qk_rope_head_dim", f"must be even for rotary embeddings, got {self.qk_rope_head_dim}")
        if self.gdn_conv_size < 2:
            fail("gdn_conv_size", f"must be at least 2, got {self.gdn_conv_size}")
        self._validate_rope()

    def _validate_rope(self) -> None:
        rope = self.rope_parameters
        field = "rope_parameters (rope_scaling)"
        if not isinstance(rope, dict):
            raise ValueError(f"ZebraConfig.{field}: must be a dict, got {rope!r}")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        known = ("default", "linear", "dynamic", "yarn")
        if rope_type not in known:
            raise ValueError(f"ZebraConfig.{field}: rope_type {rope_type!r} is not one of {known}")
        theta = rope.get("rope_theta")
        if not isinstance(theta, int | float) or isinstance(theta, bool) or theta <= 0:
            raise ValueError(f"ZebraConfig.{field}: rope_theta must be a positive number, got {theta!r}")
        if rope_type != "default":
            factor = rope.get("factor")
            if not isinstance(factor, int | float) or isinstance(factor, bool) or factor < 1:
                raise ValueError(f"ZebraConfig.{field}: factor must be a number >= 1 for {rope_type}, got {factor!r}")
        if rope_type == "yarn":
            original = rope.get("original_max_position_embeddings")
            if not isinstance(original, int) or isinstance(original, bool) or original <= 0:
                raise ValueError(
                    f"ZebraConfig.{field}: yarn needs a positive integer original_max_position_embeddings, "
                    f"got {original!r}"
                )
            for key in ("mscale", "mscale_all_dim", "beta_fast", "beta_slow", "attention_factor"):
                value = rope.get(key)
                if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
                    raise ValueError(f"ZebraConfig.{field}: {key} must be a number, got {value!r}")

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ZebraConfig:
        """Configurations of the released checkpoints (and ``tiny`` for CPU work), by name."""
        if name not in PRESETS:
            raise ValueError(f"Unknown Zebra preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
        values = copy.deepcopy(PRESETS[name])
        values.update(overrides)
        return cls(**values)

    @classmethod
    def from_released(cls, base_config: dict[str, Any], hybrid_config: dict[str, Any]) -> ZebraConfig:
        """Translate AMD's released layout: Qwen3's ``config.json`` plus ``hybrid_config.json``."""
        return cls(**released_layout_to_kwargs(base_config, hybrid_config))

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """Also accepts a directory in the released layout (detected by its ``hybrid_config.json``)."""
        path = os.fspath(pretrained_model_name_or_path)
        if is_released_layout(path):
            for key in [k for k in kwargs if k.startswith("_") or k in _HUB_LOADING_KWARGS]:
                kwargs.pop(key)
            result = cls.from_dict(released_layout_to_kwargs(*_read_released_files(path)), **kwargs)
            config = result[0] if isinstance(result, tuple) else result
            config._name_or_path = path
            return result
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)


# Hub/download options that from_pretrained receives but a local released directory does not use.
_HUB_LOADING_KWARGS = {
    "cache_dir",
    "force_download",
    "proxies",
    "token",
    "revision",
    "local_files_only",
    "subfolder",
    "gguf_file",
    "trust_remote_code",
    "code_revision",
}

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
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "attention_bias",
    "attention_dropout",
)
# hybrid_config.json keys that describe the recipe rather than the architecture.
_HYBRID_IGNORED = {"linear_type", "mla_layers", "rope_scaling", "rope_theta", "model_type", "architectures"}


def released_layout_to_kwargs(base_config: dict[str, Any], hybrid_config: dict[str, Any]) -> dict[str, Any]:
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
        layer_types = _layer_types_from_mla_indices(hybrid_config["mla_layers"], num_layers)
    except ValueError as error:
        raise ValueError(f"{RELEASED_HYBRID_CONFIG}: {error}") from None
    kwargs: dict[str, Any] = {key: base_config[key] for key in _QWEN3_FIELDS if key in base_config}
    if "torch_dtype" in base_config or "dtype" in base_config:
        kwargs["dtype"] = base_config.get("dtype", base_config.get("torch_dtype"))
    kwargs["num_hidden_layers"] = num_layers
    kwargs["layer_types"] = layer_types
    for source, target in _HYBRID_FIELD_MAP.items():
        if source in hybrid_config:
            kwargs[target] = hybrid_config[source]
    rope_theta = hybrid_config.get("rope_theta", base_config.get("rope_theta", 1_000_000.0))
    rope = hybrid_config.get("rope_scaling") or base_config.get("rope_scaling")
    if rope:
        rope = dict(rope)
        if "type" in rope and "rope_type" not in rope:
            rope["rope_type"] = rope.pop("type")
        rope.setdefault("rope_theta", rope_theta)
        kwargs["rope_parameters"] = rope
        if rope.get("rope_type") == "yarn" and "max_position_embeddings" not in hybrid_config:
            kwargs["max_position_embeddings"] = int(rope["original_max_position_embeddings"] * rope["factor"])
    else:
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": rope_theta}
    unknown = sorted(set(hybrid_config) - set(_HYBRID_FIELD_MAP) - _HYBRID_IGNORED - set(_QWEN3_FIELDS))
    if unknown:
        logger.warning("%s: ignoring fields Zebra does not use: %s", RELEASED_HYBRID_CONFIG, ", ".join(unknown))
    return kwargs


def _read_released_files(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        base = json.load(f)
    with open(os.path.join(path, RELEASED_HYBRID_CONFIG), encoding="utf-8") as f:
        hybrid = json.load(f)
    return base, hybrid


def load_released_config(path: str) -> ZebraConfig:
    """Read a released-layout directory (``config.json`` + ``hybrid_config.json``)."""
    config = ZebraConfig.from_released(*_read_released_files(path))
    config._name_or_path = path
    return config


def is_released_layout(path: str | os.PathLike) -> bool:
    return os.path.isfile(os.path.join(os.fspath(path), RELEASED_HYBRID_CONFIG))


__all__ = ["ZebraConfig", "PRESETS", "PRESET_HUB_IDS", "is_released_layout", "load_released_config"]

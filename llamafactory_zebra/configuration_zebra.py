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
from transformers import PreTrainedConfig

logger = logging.getLogger(__name__)

MLA = "mla"
GDN = "gdn"
LAYER_TYPES = (MLA, GDN)

# MLA norm placements (see ``layers/mla.py``): Qwen3's per-head q/k norms, AMD's latent norms, or none.
MLA_NORM_QK_HEAD = "qk_head"
MLA_NORM_LORA = "lora"
MLA_NORM_NONE = "none"
MLA_NORMS = (MLA_NORM_QK_HEAD, MLA_NORM_LORA, MLA_NORM_NONE)

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


def _fail(field: str, message: str) -> None:
    raise ValueError(f"ZebraConfig.{field}: {message}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_ROPE_TYPES = ("default", "linear", "dynamic", "yarn")


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
    in ``rope_parameters`` apply there). ``rope_interleave`` rotates the channel pairs (2j, 2j+1) as AMD's
    MLA code and DeepSeek-V3 do (``false``: Qwen3's half-split pairs (j, j+d/2)); ``mla_norm`` says which
    RMSNorms the MLA layers carry (``layers/mla.py``). GDN layers carry no positions; their state is
    ``gdn_num_heads × gdn_head_dim × gdn_head_dim·gdn_expand_v`` per sequence, and ``gdn_norm_eps`` is
    the eps of their gated output norm: fla's ``GatedDeltaNet`` default (1e-5), which AMD's hybrids
    instantiate — not Qwen3's ``rms_norm_eps`` (1e-6), which only the decoder norms use.

    The layer plan is stored as ``layers_block_type`` (read and written as ``layer_types`` through
    ``attribute_map``, as transformers' Nemotron-H does): transformers checks any ``layer_types`` entry of
    a config.json against its own fixed list of names — also where it reads a checkpoint's config through
    the base class (Trainer's ``resume_from_checkpoint``) — and "mla"/"gdn" are not on it.
    ``head_dim`` is set to ``qk_rope_head_dim`` because transformers' RoPE initialisers read it.
    """

    model_type = "zebra"
    attribute_map = {"layer_types": "layers_block_type"}
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
    layers_block_type: list[str] | None = None
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    q_lora_rank: int | None = 1344
    kv_lora_rank: int = 256
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    rope_interleave: bool = True
    mla_norm: str = MLA_NORM_QK_HEAD
    gdn_num_heads: int = 6
    gdn_head_dim: int = 256
    gdn_expand_v: int = 2
    gdn_conv_size: int = 4
    gdn_norm_eps: float = 1e-5
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
        layer_types = kwargs.pop("layer_types", None)
        mla_layers = kwargs.pop("mla_layers", None)
        if mla_layers is not None:
            layer_types = _layer_types_from_mla_indices(mla_layers, self.num_hidden_layers)
        if layer_types is not None:
            self.layer_types = list(layer_types) if isinstance(layer_types, tuple) else layer_types
        if self.layer_types is None:
            self.layer_types = _every_fourth_from_one(self.num_hidden_layers)
        if self.rope_parameters is None and "rope_scaling" not in kwargs:
            self.rope_parameters = {"rope_type": "default", "rope_theta": kwargs.pop("rope_theta", 1_000_000.0)}
        self.qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        self.head_dim = self.qk_rope_head_dim
        super().__post_init__(**kwargs)

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
    def mla_cache_channels(self) -> int:
        """Values an MLA layer caches per token: latent + rope key (+ each key head's ``1 / rms`` for ``qk_head``)."""
        qk_head_scales = self.num_key_value_heads if self.mla_norm == MLA_NORM_QK_HEAD else 0
        return self.kv_lora_rank + self.qk_rope_head_dim + qk_head_scales

    @property
    def num_key_value_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def validate_architecture(self) -> None:
        """Part of ``@strict``'s validation (types are checked there): sizes that must be positive or fit."""
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
            if getattr(self, field) <= 0:
                _fail(field, f"must be a positive integer, got {getattr(self, field)!r}")
        if self.q_lora_rank is not None and self.q_lora_rank <= 0:
            _fail("q_lora_rank", f"must be a positive integer or null, got {self.q_lora_rank!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            _fail(
                "num_key_value_heads",
                f"{self.num_key_value_heads} does not divide num_attention_heads={self.num_attention_heads}",
            )
        if self.qk_rope_head_dim % 2:
            _fail("qk_rope_head_dim", f"must be even for rotary embeddings, got {self.qk_rope_head_dim}")
        if self.gdn_conv_size < 2:
            _fail("gdn_conv_size", f"must be at least 2, got {self.gdn_conv_size}")
        if self.mla_norm not in MLA_NORMS:
            _fail("mla_norm", f"{self.mla_norm!r} is not one of {MLA_NORMS}")
        for field in ("rms_norm_eps", "gdn_norm_eps"):
            if not getattr(self, field) > 0:
                _fail(field, f"must be a positive number, got {getattr(self, field)!r}")

    def validate_layer_type(self) -> None:
        """Zebra's own layer names (replaces transformers' check against its fixed list of attention kinds)."""
        if not isinstance(self.layer_types, list):
            _fail("layer_types", f"must be a list of {LAYER_TYPES}, got {self.layer_types!r}")
        if len(self.layer_types) != self.num_hidden_layers:
            _fail(
                "layer_types",
                f"has {len(self.layer_types)} entries but num_hidden_layers is {self.num_hidden_layers}",
            )
        for index, layer_type in enumerate(self.layer_types):
            if layer_type not in LAYER_TYPES:
                _fail("layer_types", f"entry {index} is {layer_type!r}; each entry must be one of {LAYER_TYPES}")

    def validate_rope(self) -> None:
        """The values transformers' rope checks only warn about are errors here; its key checks still run."""
        rope = self.rope_parameters
        field = "rope_parameters (rope_scaling)"
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in _ROPE_TYPES:
            _fail(field, f"rope_type {rope_type!r} is not one of {_ROPE_TYPES}")
        if not _is_number(rope.get("rope_theta")) or rope["rope_theta"] <= 0:
            _fail(field, f"rope_theta must be a positive number, got {rope.get('rope_theta')!r}")
        if rope_type != "default" and (not _is_number(rope.get("factor")) or rope["factor"] < 1):
            _fail(field, f"factor must be a number >= 1 for {rope_type}, got {rope.get('factor')!r}")
        if rope_type == "yarn":
            original = rope.get("original_max_position_embeddings")
            if not isinstance(original, int) or isinstance(original, bool) or original <= 0:
                _fail(field, f"yarn needs a positive integer original_max_position_embeddings, got {original!r}")
            for key in ("mscale", "mscale_all_dim", "beta_fast", "beta_slow", "attention_factor"):
                if rope.get(key) is not None and not _is_number(rope[key]):
                    _fail(field, f"{key} must be a number, got {rope[key]!r}")
        try:
            super().validate_rope()
        except KeyError as error:
            _fail(field, str(error.args[0]))

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
        if checkpoint_layout(path) == RELEASED_LAYOUT:
            for key in [k for k in kwargs if k.startswith("_") or k in _HUB_LOADING_KWARGS]:
                kwargs.pop(key)
            result = cls.from_dict(released_directory_kwargs(path), **kwargs)
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
        layer_types = _layer_types_from_mla_indices(hybrid_config["mla_layers"], num_layers)
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


def released_directory_kwargs(path: str) -> dict[str, Any]:
    """``released_layout_to_kwargs`` for a directory, with ``mla_norm`` decided by the weights' MLA keys."""
    from .checkpoint import detect_mla_norm

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


def _read_released_files(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        base = json.load(f)
    with open(os.path.join(path, RELEASED_HYBRID_CONFIG), encoding="utf-8") as f:
        hybrid = json.load(f)
    return base, hybrid


def load_released_config(path: str) -> ZebraConfig:
    """Read a released-layout directory (``config.json`` + ``hybrid_config.json`` + the weights' key names)."""
    config = ZebraConfig(**released_directory_kwargs(path))
    config._name_or_path = path
    return config


NATIVE_LAYOUT = "native"
RELEASED_LAYOUT = "released"


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


__all__ = [
    "ZebraConfig",
    "PRESETS",
    "PRESET_HUB_IDS",
    "NATIVE_LAYOUT",
    "RELEASED_LAYOUT",
    "checkpoint_layout",
    "load_released_config",
]

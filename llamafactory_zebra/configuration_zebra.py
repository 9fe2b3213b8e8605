"""Configuration of the Zebra hybrids: Qwen3 decoders whose token mixers are MLA or Gated DeltaNet.

Fields and their validation only, as transformers' ``Qwen3NextConfig``. The released shapes are in
``presets.py`` (``ZebraConfig.from_preset``); AMD's released layout (a Qwen3 ``config.json`` plus a
``hybrid_config.json``) is translated by ``released/``.
"""

from __future__ import annotations

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

from .presets import preset_values

MLA = "mla"
GDN = "gdn"
LAYER_TYPES = (MLA, GDN)

# MLA norm placements (see ``layers/mla.py``): Qwen3's per-head q/k norms, AMD's latent norms, or none.
MLA_NORM_QK_HEAD = "qk_head"
MLA_NORM_LORA = "lora"
MLA_NORM_NONE = "none"
MLA_NORMS = (MLA_NORM_QK_HEAD, MLA_NORM_LORA, MLA_NORM_NONE)

_ROPE_TYPES = ("default", "linear", "dynamic", "yarn")


def _every_fourth_from_one(num_layers: int) -> list[str]:
    return [MLA if i % 4 == 1 else GDN for i in range(num_layers)]


def layer_types_from_mla_indices(mla_layers: Any, num_layers: int) -> list[str]:
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
        other_model = kwargs.get("model_type", self.model_type)
        if other_model != self.model_type:
            # Would otherwise build a Zebra config from another model's fields, with the default plan.
            _fail(
                "model_type",
                f"this config.json describes a {other_model!r} model, not {self.model_type!r}. A directory whose "
                "config.json is Qwen3's and that holds a hybrid_config.json is AMD's released layout: load it with "
                "ZebraForCausalLM.from_pretrained(path) or llamafactory_zebra.released.load_released_config(path), "
                "or write a native copy with `llamafactory-zebra import RELEASED_DIR OUTPUT_DIR`",
            )
        layer_types = kwargs.pop("layer_types", None)
        mla_layers = kwargs.pop("mla_layers", None)
        if mla_layers is not None:
            layer_types = layer_types_from_mla_indices(mla_layers, self.num_hidden_layers)
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
        """Configurations of the released checkpoints (and ``tiny`` for CPU work), by name (``presets.py``)."""
        return cls(**preset_values(name, **overrides))


def is_zebra_config(config: Any) -> bool:
    """Whether ``config`` (any transformers config, or ``None``) describes a Zebra model: its ``model_type``."""
    return getattr(config, "model_type", None) == ZebraConfig.model_type


__all__ = ["ZebraConfig", "MLA", "GDN", "LAYER_TYPES", "MLA_NORMS", "is_zebra_config"]

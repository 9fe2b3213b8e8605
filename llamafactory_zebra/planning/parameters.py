"""Every parameterised module of a Zebra model, derived from its config without building the model.

The memory planner needs more than a total: DeepSpeed ZeRO-3 gathers one module at a time (so the
largest module sets a working-set floor), LoRA adds ``r·(in + out)`` per targeted ``Linear``, and freeze
tuning trains whole decoder layers. Building the model on the meta device would give the same
inventory but ties the planner to importable modeling code and costs seconds; the layout below is the
released checkpoints' (``docs/architecture.md``) and a test checks it against ``named_modules()`` of the
real model, parameter for parameter.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..configuration_zebra import MLA, MLA_NORM_LORA, MLA_NORM_QK_HEAD, ZebraConfig


@dataclass(frozen=True)
class ModuleParams:
    """One module that owns parameters directly (``recurse=False``), as DeepSpeed's estimator counts them."""

    name: str
    params: int
    linear: tuple[int, int] | None = None
    """``(in_features, out_features)`` when the module is an ``nn.Linear`` (a LoRA target)."""

    @property
    def layer_index(self) -> int | None:
        match = re.match(r"model\.layers\.(\d+)\.", self.name)
        return int(match.group(1)) if match else None


def _linear(name: str, n_in: int, n_out: int) -> ModuleParams:
    return ModuleParams(name, n_in * n_out, (n_in, n_out))


def _mla_modules(prefix: str, c: ZebraConfig) -> list[ModuleParams]:
    h, heads, kv_heads = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
    qk_head = c.qk_nope_head_dim + c.qk_rope_head_dim
    lora_norms = c.mla_norm == MLA_NORM_LORA
    if c.q_lora_rank is None:
        queries = [_linear(f"{prefix}.q_proj", h, heads * qk_head)]
    else:
        queries = [
            _linear(f"{prefix}.q_a_proj", h, c.q_lora_rank),
            *([ModuleParams(f"{prefix}.q_a_layernorm", c.q_lora_rank)] if lora_norms else []),
            _linear(f"{prefix}.q_b_proj", c.q_lora_rank, heads * qk_head),
        ]
    norms = []
    if c.mla_norm == MLA_NORM_QK_HEAD:
        norms = [ModuleParams(f"{prefix}.q_norm", qk_head), ModuleParams(f"{prefix}.k_norm", qk_head)]
    return queries + [
        _linear(f"{prefix}.kv_a_proj_with_mqa", h, c.kv_lora_rank + c.qk_rope_head_dim),
        *([ModuleParams(f"{prefix}.kv_a_layernorm", c.kv_lora_rank)] if lora_norms else []),
        _linear(f"{prefix}.kv_b_proj", c.kv_lora_rank, kv_heads * (c.qk_nope_head_dim + c.v_head_dim)),
        _linear(f"{prefix}.out_proj", heads * c.v_head_dim, h),
        *norms,
    ]


def _gdn_modules(prefix: str, c: ZebraConfig) -> list[ModuleParams]:
    h, heads = c.hidden_size, c.gdn_num_heads
    key_dim, value_dim = heads * c.gdn_head_dim, heads * c.gdn_head_dim * c.gdn_expand_v
    return [
        ModuleParams(prefix, 2 * heads),  # A_log and dt_bias live on the mixer itself
        _linear(f"{prefix}.q_proj", h, key_dim),
        _linear(f"{prefix}.k_proj", h, key_dim),
        _linear(f"{prefix}.v_proj", h, value_dim),
        _linear(f"{prefix}.a_proj", h, heads),
        _linear(f"{prefix}.b_proj", h, heads),
        ModuleParams(f"{prefix}.q_conv1d", key_dim * c.gdn_conv_size),
        ModuleParams(f"{prefix}.k_conv1d", key_dim * c.gdn_conv_size),
        ModuleParams(f"{prefix}.v_conv1d", value_dim * c.gdn_conv_size),
        _linear(f"{prefix}.g_proj", h, value_dim),
        ModuleParams(f"{prefix}.o_norm", c.gdn_head_dim * c.gdn_expand_v),
        _linear(f"{prefix}.o_proj", value_dim, h),
    ]


def zebra_modules(config: ZebraConfig) -> list[ModuleParams]:
    """All parameter-owning modules of ``ZebraForCausalLM`` in ``named_modules()`` naming."""
    c, h = config, config.hidden_size
    modules = [ModuleParams("model.embed_tokens", c.vocab_size * h)]
    for index, layer_type in enumerate(c.layer_types):
        prefix = f"model.layers.{index}"
        mixer = _mla_modules(f"{prefix}.mla", c) if layer_type == MLA else _gdn_modules(f"{prefix}.gdn", c)
        modules += mixer + [
            _linear(f"{prefix}.mlp.gate_proj", h, c.intermediate_size),
            _linear(f"{prefix}.mlp.up_proj", h, c.intermediate_size),
            _linear(f"{prefix}.mlp.down_proj", c.intermediate_size, h),
            ModuleParams(f"{prefix}.input_layernorm", h),
            ModuleParams(f"{prefix}.post_attention_layernorm", h),
        ]
    modules.append(ModuleParams("model.norm", h))
    if not c.tie_word_embeddings:
        modules.append(_linear("lm_head", h, c.vocab_size))
    return modules


@dataclass(frozen=True)
class ParameterSummary:
    total: int
    largest_module: int
    mla_layer: int
    """One MLA decoder layer (mixer + MLP + norms); 0 when the plan has none."""
    gdn_layer: int
    embeddings_and_head: int


def summarize(config: ZebraConfig) -> ParameterSummary:
    modules = zebra_modules(config)

    def layer_total(layer_type: str) -> int:
        if layer_type not in config.layer_types:
            return 0
        index = config.layer_types.index(layer_type)
        return sum(m.params for m in modules if m.layer_index == index)

    return ParameterSummary(
        total=sum(m.params for m in modules),
        largest_module=max(m.params for m in modules),
        mla_layer=layer_total(MLA),
        gdn_layer=layer_total("gdn"),
        embeddings_and_head=sum(m.params for m in modules if m.name in ("model.embed_tokens", "lm_head")),
    )


def _matches_target(module_name: str, targets: Iterable[str]) -> bool:
    """PEFT's rule for a list of ``target_modules``: the name equals a target or ends with ``.<target>``."""
    return any(module_name == t or module_name.endswith(f".{t}") for t in targets)


def lora_trainable_params(
    config: ZebraConfig, rank: int, targets: list[str], additional_targets: list[str] | None = None
) -> int:
    """LoRA A/B matrices on every targeted ``Linear`` plus fully trained ``additional_target`` modules.

    ``targets == ["all"]`` is LLaMA-Factory's ``find_all_linear_modules``: every Linear but ``lm_head``.
    """
    modules = zebra_modules(config)
    if targets == ["all"]:
        linear_names = {m.name.rsplit(".", 1)[-1] for m in modules if m.linear and m.name != "lm_head"}
        targets = sorted(linear_names)
    lora = sum(rank * sum(m.linear) for m in modules if m.linear and _matches_target(m.name, targets))
    extra = sum(m.params for m in modules if _matches_target(m.name, additional_targets or []))
    return lora + extra


def freeze_trainable_params(
    config: ZebraConfig, trainable_layers: int, trainable_modules: list[str], extra_modules: list[str] | None = None
) -> int:
    """Parameters LLaMA-Factory's freeze tuning leaves trainable (its ``_setup_freeze_tuning`` rules).

    Positive ``trainable_layers`` trains the last N decoder layers, negative the first N; inside them only
    ``trainable_modules`` (``["all"]`` or sub-module names such as ``mlp``, ``mla``, ``gdn``);
    ``extra_modules`` names non-layer modules (``embed_tokens``, ``norm``, ``lm_head``).
    """
    n = config.num_hidden_layers
    layers = range(max(0, n - trainable_layers), n) if trainable_layers > 0 else range(min(-trainable_layers, n))
    patterns = [
        f"model.layers.{i}." + ("*" if module == "all" else f"{module}*")
        for i in layers
        for module in trainable_modules
    ]
    modules = zebra_modules(config)
    chosen = sum(m.params for m in modules if any(fnmatch.fnmatchcase(m.name, p) for p in patterns))
    extra = sum(m.params for m in modules if m.layer_index is None and _matches_target(m.name, extra_modules or []))
    return chosen + extra

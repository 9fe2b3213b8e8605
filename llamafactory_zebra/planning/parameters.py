"""Every parameterised module of a Zebra model, read off the model itself built on the meta device
(``inventory.meta_model``).

The memory planner needs more than a total: DeepSpeed ZeRO-3 gathers one module at a time (so the
largest module sets a working-set floor), LoRA adds ``r·(in + out)`` per targeted ``Linear``, and freeze
tuning trains whole decoder layers. A meta-device build allocates no memory (the 2.28B model builds in
under a tenth of a second on a quiet machine), so the inventory is ``named_modules()`` of the real model
and follows any change to the modeling code (MLA norm variants, new projections) without a second copy
of the layout here. Inventories are cached per configuration because the planner's search for a fix
asks for the same model many times.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ..configuration_zebra import MLA, ZebraConfig
from ..inventory import meta_model


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


_INVENTORIES: dict[str, tuple[ModuleParams, ...]] = {}


def _build_inventory(config: ZebraConfig) -> tuple[ModuleParams, ...]:
    modules = []
    for name, module in meta_model(config).named_modules():
        params = sum(p.numel() for p in module.parameters(recurse=False))
        if params:
            linear = (module.in_features, module.out_features) if isinstance(module, torch.nn.Linear) else None
            modules.append(ModuleParams(name, params, linear))
    return tuple(modules)


def zebra_modules(config: ZebraConfig) -> list[ModuleParams]:
    """All parameter-owning modules of ``ZebraForCausalLM(config)`` in ``named_modules()`` order and naming."""
    key = config.to_json_string(use_diff=False)
    if key not in _INVENTORIES:
        _INVENTORIES[key] = _build_inventory(config)
    return list(_INVENTORIES[key])


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

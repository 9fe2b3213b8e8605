"""The model-loading seams: Zebra in LLaMA-Factory's model list and templates, AMD's released layout, fused
cross-entropy, and LLaMA-Factory's RoPE rule without its two problems.

Seams (``SEAMS``; installed by ``seams.install`` when each module loads):
- ``extras.constants.register_model_group``: web UI model list + default template (a public registry).
- ``data.template.TEMPLATES``: ``template: zebra`` as a name for the Qwen3 ChatML template.
- ``model.loader.load_config``: a released-layout directory (``hybrid_config.json``) loads as Zebra.
- ``model.loader.apply_liger_kernel``: Liger dispatches on ``model_type`` and skips unknown types; for
  Zebra the fused linear cross-entropy is switched on by ``patch_model`` below instead.
- ``model.loader.patch_model``: after the model exists, enable fused CE when ``enable_liger_kernel``.
- ``model.patcher.configure_rope``: LLaMA-Factory replaces ``rope_scaling`` wholesale, dropping
  ``rope_theta`` and YaRN's ``mscale`` keys, and writes a float ``max_position_embeddings`` that strict
  transformers-5 configs reject; for Zebra the same rule runs here without either problem.
"""

from __future__ import annotations

import functools
import math
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..configuration_zebra import ZebraConfig, is_zebra_config
from ..released import RELEASED_HYBRID_CONFIG, RELEASED_LAYOUT, checkpoint_layout, load_released_config
from ..seam import Seam, UpstreamSeamChanged, original

if TYPE_CHECKING:
    from llamafactory.extras.logging import _Logger
    from llamafactory.hparams import ModelArguments

# Keys that only mean something to YaRN; they leave when rope_scaling switches to another type.
YARN_ONLY_ROPE_KEYS = ("mscale", "mscale_all_dim", "beta_fast", "beta_slow", "attention_factor")

ZEBRA_TEMPLATE = "zebra"
BASE_TEMPLATE = "qwen3"


def register_model_groups(constants: ModuleType) -> None:
    from .model_groups import MODEL_GROUPS

    register = original(constants, "register_model_group")
    for models in MODEL_GROUPS:
        register(
            models={name: {constants.DownloadSource.DEFAULT: hub_id} for name, hub_id in models.items()},
            template=ZEBRA_TEMPLATE,
        )


def register_template(template_module: ModuleType) -> None:
    """``template: zebra`` is LLaMA-Factory's own ``qwen3`` template object under the Zebra name."""
    templates = template_module.TEMPLATES
    if BASE_TEMPLATE not in templates:
        raise UpstreamSeamChanged(f"LLaMA-Factory has no {BASE_TEMPLATE!r} template any more")
    templates.setdefault(ZEBRA_TEMPLATE, templates[BASE_TEMPLATE])


def released_layout_load_config(loader: ModuleType) -> Any:
    load_config = original(loader, "load_config")

    @functools.wraps(load_config)
    def zebra_load_config(model_args):
        if checkpoint_layout(model_args.model_name_or_path) == RELEASED_LAYOUT:
            loader.logger.info_rank0(
                f"llamafactory-zebra: {model_args.model_name_or_path} is in AMD's released layout "
                f"({RELEASED_HYBRID_CONFIG}); loading it as ZebraForCausalLM"
            )
            return load_released_config(model_args.model_name_or_path)
        return load_config(model_args)

    return zebra_load_config


def liger_left_to_patch_model(loader: ModuleType) -> Any:
    apply_liger_kernel = original(loader, "apply_liger_kernel")

    @functools.wraps(apply_liger_kernel)
    def zebra_apply_liger_kernel(config, model_args, is_trainable, require_logits):
        if not is_zebra_config(config):
            return apply_liger_kernel(config, model_args, is_trainable, require_logits)
        if model_args.enable_liger_kernel and require_logits:
            loader.logger.warning_rank0("llamafactory-zebra: this stage needs logits; fused cross-entropy stays off")
        return None

    return zebra_apply_liger_kernel


def fused_cross_entropy_after_patch(loader: ModuleType) -> Any:
    patch_model = original(loader, "patch_model")

    @functools.wraps(patch_model)
    def zebra_patch_model(model, tokenizer, model_args, is_trainable, add_valuehead):
        patch_model(model, tokenizer, model_args, is_trainable, add_valuehead)
        if is_zebra_config(model.config):
            loader.logger.info_rank0(f"llamafactory-zebra: model class {type(model).__name__}")
            if model_args.enable_liger_kernel and is_trainable and not add_valuehead:
                backend = model.enable_fused_cross_entropy("auto")
                loader.logger.info_rank0(f"llamafactory-zebra: fused linear cross-entropy on ({backend})")

    return zebra_patch_model


def zebra_rope_rule(patcher: ModuleType) -> Any:
    configure_rope = original(patcher, "configure_rope")

    @functools.wraps(configure_rope)
    def zebra_configure_rope(config, model_args):
        if not is_zebra_config(config):
            return configure_rope(config, model_args)
        return configure_zebra_rope(config, model_args, patcher.logger)

    return zebra_configure_rope


def configure_zebra_rope(config: ZebraConfig, model_args: ModelArguments, logger: _Logger) -> None:
    """LLaMA-Factory's ``rope_scaling`` rule for Zebra, keeping what upstream's version loses.

    Same factor as upstream (``ceil(model_max_length / original window)``, 2.0 for inference), but the
    checkpoint's other rope keys (``rope_theta``, YaRN's ``mscale``/``mscale_all_dim``/betas) stay, and
    ``max_position_embeddings`` stays an integer (upstream writes a float, which transformers 5's strict
    configs reject).
    """
    if model_args.rope_scaling is None:
        return
    rope_type = getattr(model_args.rope_scaling, "value", model_args.rope_scaling)
    before = dict(config.rope_parameters)
    original_window = before.get("original_max_position_embeddings", config.max_position_embeddings)
    if model_args.model_max_length is not None:
        if model_args.model_max_length <= original_window:
            logger.warning_rank0("Input length is smaller than max length. Disabling rope scaling.")
            return
        factor = float(math.ceil(model_args.model_max_length / original_window))
    else:
        factor = 2.0
    merged = {
        **before,
        "rope_type": rope_type,
        "factor": factor,
        "original_max_position_embeddings": original_window,
    }
    if rope_type not in ("yarn", "dynamic", "llama3"):
        del merged["original_max_position_embeddings"]
    if rope_type != "yarn":
        merged = {key: value for key, value in merged.items() if key not in YARN_ONLY_ROPE_KEYS}
    config.rope_parameters = merged
    config.max_position_embeddings = int(original_window * factor)
    config.validate_rope()
    logger.info_rank0(f"llamafactory-zebra: {rope_type} RoPE factor {factor} on the MLA rope dims ({merged})")


SEAMS = (
    Seam("llamafactory.extras.constants", "register_model_group", ("models", "template", "multimodal"),
         register=register_model_groups),
    Seam("llamafactory.data.template", "TEMPLATES", register=register_template),
    Seam("llamafactory.model.loader", "load_config", ("model_args",), wrapper=released_layout_load_config),
    Seam("llamafactory.model.loader", "apply_liger_kernel", ("config", "model_args", "is_trainable", "require_logits"),
         wrapper=liger_left_to_patch_model),
    Seam("llamafactory.model.loader", "patch_model",
         ("model", "tokenizer", "model_args", "is_trainable", "add_valuehead"),
         wrapper=fused_cross_entropy_after_patch),
    Seam("llamafactory.model.patcher", "configure_rope", ("config", "model_args"), wrapper=zebra_rope_rule),
)  # fmt: skip

"""Every place where llamafactory-zebra changes LLaMA-Factory 0.9.5 behaviour, and why.

``UPSTREAM_SEAMS`` lists every upstream name the plugin wraps or relies on, with the parameters relied
on; ``tests/integration/test_upstream_seams.py`` fails when an upgrade moves or renames any of them, and
:func:`require_seam` raises at activation with the same message, instead of patching the wrong thing.
:func:`wrap` is the one door through which any upstream attribute is replaced: it checks the seam,
marks the wrapper with the original and refuses to wrap a name twice (:func:`wrapped` for one ``with``
block; :func:`wrapped_method` for one object's method, its class untouched). ``TRANSFORMERS_REGISTRATIONS``
lists the entries the plugin adds to transformers' registries through their own ``register`` methods
(no attribute is replaced there; :func:`register_attention_function` is the door for the attention one). Wrappers change nothing for
non-Zebra models; they live next to the behaviour they add (this module: model loading; ``training``:
``get_train_args`` and the SFT trainer; ``datasets``; ``webui``; ``sequence_parallel``: DeepSpeed's
``initialize`` during an SP run). ``docs/llamafactory.md``'s seam table is tested against this list.

Seams (module → name):
- ``extras.constants.register_model_group``: web UI model list + default template (a public registry).
- ``data.template.TEMPLATES``: ``template: zebra`` as a name for the Qwen3 ChatML template.
- ``model.loader.load_config``: a released-layout directory (``hybrid_config.json``) loads as Zebra.
- ``model.loader.apply_liger_kernel``: Liger dispatches on ``model_type`` and skips unknown types; for
  Zebra the fused linear cross-entropy is switched on by ``patch_model`` below instead.
- ``model.loader.patch_model``: after the model exists, enable fused CE when ``enable_liger_kernel``.
- ``model.patcher.configure_rope``: LLaMA-Factory replaces ``rope_scaling`` wholesale, dropping
  ``rope_theta`` and YaRN's ``mscale`` keys, and writes a float ``max_position_embeddings`` that strict
  transformers-5 configs reject; for Zebra the same rule runs here without either problem.
- ``hparams.parser.get_train_args``: see ``training.py``.
- ``hparams.parser.get_infer_args``: chat, API, export, eval-long log the resolved kernels (``kernel_choice.py``).
- ``launcher.launch``: ``llamafactory-cli train`` checks the plugin's keys against the world size before
  torchrun starts (``launcher.py``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from ..configuration_zebra import ZebraConfig
from ..released import RELEASED_HYBRID_CONFIG, RELEASED_LAYOUT, checkpoint_layout, load_released_config

# Every name in LLaMA-Factory (and the few in transformers, accelerate and DeepSpeed) that the plugin wraps,
# replaces or relies on: (module, attribute — dotted for class members, parameters relied on, in order).
# Every wrapper is installed through wrap() / wrapped() / wrapped_method(), which check it against this table; tests/integration/test_upstream_seams.py
# checks the table against the installed LLaMA-Factory and against docs/llamafactory.md.
UPSTREAM_SEAMS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("llamafactory.extras.constants", "register_model_group", ("models", "template", "multimodal")),
    ("llamafactory.model.loader", "load_config", ("model_args",)),
    ("llamafactory.model.loader", "apply_liger_kernel", ("config", "model_args", "is_trainable", "require_logits")),
    (
        "llamafactory.model.loader",
        "patch_model",
        ("model", "tokenizer", "model_args", "is_trainable", "add_valuehead"),
    ),
    ("llamafactory.model.patcher", "configure_rope", ("config", "model_args")),
    ("llamafactory.launcher", "launch", ()),
    ("llamafactory.extras.misc", "is_env_enabled", ("env_var", "default")),
    ("llamafactory.extras.misc", "get_device_count", ()),
    ("llamafactory.extras.misc", "use_ray", ()),
    ("llamafactory.extras.misc", "use_kt", ()),
    ("llamafactory.hparams.parser", "get_train_args", ("args",)),
    ("llamafactory.hparams.parser", "read_args", ("args",)),
    ("llamafactory.hparams.parser", "get_infer_args", ("args",)),
    ("llamafactory.data.converter", "register_dataset_converter", ("name", "dataset_converter")),
    ("llamafactory.data.converter", "get_dataset_converter", ("name", "dataset_attr", "data_args")),
    ("llamafactory.data.parser", "get_dataset_list", ("dataset_names", "dataset_dir")),
    ("llamafactory.data.loader", "_load_single_dataset", ("dataset_attr", "model_args", "data_args", "training_args")),
    (
        "llamafactory.data.loader",
        "_get_merged_dataset",
        ("dataset_names", "model_args", "data_args", "training_args", "stage", "return_dict"),
    ),
    ("llamafactory.webui.common", "load_dataset_info", ("dataset_dir",)),
    ("llamafactory.webui.interface", "run_web_ui", ()),
    ("llamafactory.webui.interface", "run_web_demo", ()),
    ("llamafactory.webui.engine", "Engine.resume", ("self",)),
    ("llamafactory.webui.runner", "Runner._parse_train_args", ("self", "data")),
    ("llamafactory.chat.hf_engine", "Thread", ("group", "target", "name", "args", "kwargs")),
    ("llamafactory.train.tuner", "run_exp", ("args", "callbacks")),
    (
        "llamafactory.train.sft.workflow",
        "CustomSeq2SeqTrainer",
        ("finetuning_args", "processor", "model_args", "gen_kwargs"),
    ),
    ("llamafactory.train.callbacks", "LogCallback.on_log", ("self", "args", "state", "control")),
    ("llamafactory.train.callbacks", "LogCallback._write_log", ("self", "output_dir", "logs")),
    ("llamafactory.extras.ploting", "plot_loss", ("save_dictionary", "keys")),
    ("accelerate.accelerator", "Accelerator.prepare", ("self", "args")),
    ("transformers.integrations.deepspeed", "set_hf_deepspeed_config", ("hf_deepspeed_config_obj",)),
    ("transformers.integrations.deepspeed", "unset_hf_deepspeed_config", ()),
    (
        "deepspeed",
        "initialize",
        ("args", "model", "optimizer", "model_parameters", "training_data", "lr_scheduler", "distributed_port", "mpu"),
    ),
)

# Entries the plugin puts into transformers' process-wide registries through their public ``register``
# methods: (registry, key, when). tests/integration/test_upstream_seams.py compares this with the registries' contents
# after the plugin ran; docs/llamafactory.md lists it.
TRANSFORMERS_REGISTRATIONS: tuple[tuple[str, str, str], ...] = (
    ("AutoConfig", "zebra", "import llamafactory_zebra"),
    ("AutoModel", "ZebraConfig", "import llamafactory_zebra"),
    ("AutoModelForCausalLM", "ZebraConfig", "import llamafactory_zebra"),
    ("AttentionInterface", "flash_attention_2", "a distillation teacher loads with FlashAttention"),
    ("AttentionInterface", "flash_attention_3", "a distillation teacher loads with FlashAttention"),
)

# Keys that only mean something to YaRN; they leave when rope_scaling switches to another type.
YARN_ONLY_ROPE_KEYS = ("mscale", "mscale_all_dim", "beta_fast", "beta_slow", "attention_factor")

ZEBRA_TEMPLATE = "zebra"
BASE_TEMPLATE = "qwen3"


# Attribute on every installed wrapper: the upstream object it replaced.
ORIGINAL = "__zebra_original__"


class UpstreamSeamChanged(RuntimeError):
    pass


class AlreadyWrapped(RuntimeError):
    pass


def require_seam(module: Any, attribute: str, parameters: tuple[str, ...]) -> Any:
    """``module.attribute`` (dotted for class members) if it still takes ``parameters`` first, else raise."""
    target = module
    for part in attribute.split("."):
        target = getattr(target, part, None)
    if target is None:
        raise UpstreamSeamChanged(
            f"{getattr(module, '__name__', module)}.{attribute} is gone; llamafactory-zebra supports LLaMA-Factory 0.9.x "
            "(set LLAMAFACTORY_ZEBRA_DISABLE=1 to run LLaMA-Factory without the plugin)"
        )
    actual = tuple(inspect.signature(target).parameters)
    if actual[: len(parameters)] != parameters:
        raise UpstreamSeamChanged(
            f"{getattr(module, '__name__', module)}.{attribute} now takes {actual}, expected {parameters}; "
            "llamafactory-zebra supports LLaMA-Factory 0.9.x (set LLAMAFACTORY_ZEBRA_DISABLE=1 to bypass)"
        )
    return target


def upstream(module: ModuleType, attribute: str) -> Any:
    """The declared seam ``module.attribute`` from ``UPSTREAM_SEAMS``, checked with :func:`require_seam`."""
    for module_name, name, parameters in UPSTREAM_SEAMS:
        if module_name == module.__name__ and name == attribute:
            return require_seam(module, attribute, parameters)
    raise KeyError(f"{module.__name__}.{attribute} is not declared in UPSTREAM_SEAMS")


def _owner(module: ModuleType, attribute: str) -> tuple[Any, str]:
    """The object holding the last part of a (dotted) attribute, and that part's name."""
    owner_path, _, name = attribute.rpartition(".")
    owner = module
    for part in filter(None, owner_path.split(".")):
        owner = getattr(owner, part)
    return owner, name


def is_wrapped(module: ModuleType, attribute: str) -> bool:
    """Whether ``module.attribute`` is currently a llamafactory-zebra wrapper."""
    owner, name = _owner(module, attribute)
    return hasattr(getattr(owner, name, None), ORIGINAL)


def wrap(module: ModuleType, attribute: str, wrapper: Callable) -> None:
    """Replace the declared seam ``module.attribute`` (dotted for a class member) by ``wrapper``.

    The only code in the plugin that assigns an upstream attribute. ``wrapper`` must be made with
    ``functools.wraps(original)`` around the attribute's current value (so signatures and names stay
    upstream's); it is marked with that original (:data:`ORIGINAL`). A name that already holds a
    plugin wrapper is refused: two wrappers on one name would run in an order nobody chose. Callers that
    may run twice in one process (``install_dataset_seams``) ask :func:`is_wrapped` first.
    """
    original = upstream(module, attribute)
    if is_wrapped(module, attribute):
        raise AlreadyWrapped(
            f"{module.__name__}.{attribute} is already wrapped by llamafactory-zebra; "
            "extend that wrapper instead of wrapping the name again"
        )
    if getattr(wrapper, "__wrapped__", None) is not original:
        raise ValueError(
            f"the wrapper for {module.__name__}.{attribute} must be made with functools.wraps around its current value"
        )
    setattr(wrapper, ORIGINAL, original)
    owner, name = _owner(module, attribute)
    setattr(owner, name, wrapper)


def unwrap(module: ModuleType, attribute: str) -> None:
    """Put the original back (for wrappers that only live during one call, e.g. ``deepspeed.initialize``)."""
    owner, name = _owner(module, attribute)
    current = getattr(owner, name)
    if not hasattr(current, ORIGINAL):
        raise ValueError(f"{module.__name__}.{attribute} is not wrapped by llamafactory-zebra")
    setattr(owner, name, getattr(current, ORIGINAL))


@contextlib.contextmanager
def wrapped(module: ModuleType, attribute: str, wrapper: Callable) -> Iterator[None]:
    """:func:`wrap` for the duration of a ``with`` block, then the original back."""
    wrap(module, attribute, wrapper)
    try:
        yield
    finally:
        unwrap(module, attribute)


def _declared_method(cls: type, method: str) -> tuple[ModuleType, str]:
    """The declared seam ``Class.method`` of the nearest class in ``cls``'s MRO, with its module."""
    declared = {(module, attribute) for module, attribute, _ in UPSTREAM_SEAMS}
    for base in cls.__mro__:
        if (base.__module__, f"{base.__qualname__}.{method}") in declared:
            return sys.modules[base.__module__], f"{base.__qualname__}.{method}"
    raise KeyError(f"{cls.__qualname__}.{method} is not declared in UPSTREAM_SEAMS")


@contextlib.contextmanager
def wrapped_method(instance: Any, method: str, wrapper: Callable) -> Iterator[None]:
    """``instance.method`` is ``wrapper`` for the duration of a ``with`` block: this object only, its class
    untouched (an instance attribute shadows the class's method, and is deleted afterwards).

    The method must be a declared seam (``Class.method`` of a class ``instance`` is); ``wrapper`` must be
    made with ``functools.wraps`` around the bound method, as :func:`wrap` requires.
    """
    module, attribute = _declared_method(type(instance), method)
    upstream(module, attribute)
    bound = getattr(instance, method)
    if method in vars(instance):
        raise AlreadyWrapped(f"{module.__name__}.{attribute} is already replaced on this {type(instance).__name__}")
    if getattr(wrapper, "__wrapped__", None) != bound:
        raise ValueError(f"the wrapper for {module.__name__}.{attribute} must be made with functools.wraps around it")
    setattr(wrapper, ORIGINAL, bound)
    setattr(instance, method, wrapper)
    try:
        yield
    finally:
        delattr(instance, method)


def register_attention_function(backend: str, function: Callable) -> bool:
    """``AttentionInterface.register(backend, function)`` for a declared entry of ``TRANSFORMERS_REGISTRATIONS``.

    transformers' public way to provide an attention function; it changes ``backend`` for every model in
    the process. Only a backend still mapped to transformers' own function is changed (someone else's
    registration is kept; a second call changes nothing). Returns whether the entry was registered.
    """
    from transformers.modeling_utils import AttentionInterface

    if ("AttentionInterface", backend) not in {(registry, key) for registry, key, _ in TRANSFORMERS_REGISTRATIONS}:
        raise KeyError(f"AttentionInterface[{backend!r}] is not declared in TRANSFORMERS_REGISTRATIONS")
    current = AttentionInterface._global_mapping.get(backend)
    if current is None or not current.__module__.startswith("transformers."):
        return False
    AttentionInterface.register(backend, function)
    return True


def register_sinkless_flash_attention() -> None:
    """Register, through transformers' ``AttentionInterface``, FlashAttention functions that work for models
    without attention sinks (every Qwen3 and Llama) on transformers 5.6.0 (``layers/flash_attention.py``).

    For the distillation teacher (Zebra's MLA calls its FlashAttention function directly). Process-wide,
    through :func:`register_attention_function`: someone else's registration is kept, a second call
    changes nothing.
    """
    from ..attention_policy import FLASH_ATTENTION_BACKENDS
    from ..layers.flash_attention import sinkless_flash_attention

    for backend in FLASH_ATTENTION_BACKENDS:
        register_attention_function(backend, sinkless_flash_attention)


def _is_zebra(config: Any) -> bool:
    return getattr(config, "model_type", None) == ZebraConfig.model_type


def register_model_groups(constants: ModuleType) -> None:
    from .model_groups import MODEL_GROUPS

    register = upstream(constants, "register_model_group")
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


def patch_loader(loader: ModuleType) -> None:
    load_config = upstream(loader, "load_config")
    apply_liger_kernel = upstream(loader, "apply_liger_kernel")
    patch_model = upstream(loader, "patch_model")

    @functools.wraps(load_config)
    def zebra_load_config(model_args):
        if checkpoint_layout(model_args.model_name_or_path) == RELEASED_LAYOUT:
            loader.logger.info_rank0(
                f"llamafactory-zebra: {model_args.model_name_or_path} is in AMD's released layout "
                f"({RELEASED_HYBRID_CONFIG}); loading it as ZebraForCausalLM"
            )
            return load_released_config(model_args.model_name_or_path)
        return load_config(model_args)

    @functools.wraps(apply_liger_kernel)
    def zebra_apply_liger_kernel(config, model_args, is_trainable, require_logits):
        if not _is_zebra(config):
            return apply_liger_kernel(config, model_args, is_trainable, require_logits)
        if model_args.enable_liger_kernel and require_logits:
            loader.logger.warning_rank0("llamafactory-zebra: this stage needs logits; fused cross-entropy stays off")
        return None

    @functools.wraps(patch_model)
    def zebra_patch_model(model, tokenizer, model_args, is_trainable, add_valuehead):
        patch_model(model, tokenizer, model_args, is_trainable, add_valuehead)
        if _is_zebra(model.config):
            loader.logger.info_rank0(f"llamafactory-zebra: model class {type(model).__name__}")
            if model_args.enable_liger_kernel and is_trainable and not add_valuehead:
                backend = model.enable_fused_cross_entropy("auto")
                loader.logger.info_rank0(f"llamafactory-zebra: fused linear cross-entropy on ({backend})")

    wrap(loader, "load_config", zebra_load_config)
    wrap(loader, "apply_liger_kernel", zebra_apply_liger_kernel)
    wrap(loader, "patch_model", zebra_patch_model)


def patch_rope(patcher: ModuleType) -> None:
    configure_rope = upstream(patcher, "configure_rope")

    @functools.wraps(configure_rope)
    def zebra_configure_rope(config, model_args):
        if not _is_zebra(config):
            return configure_rope(config, model_args)
        return configure_zebra_rope(config, model_args, patcher.logger)

    wrap(patcher, "configure_rope", zebra_configure_rope)


def configure_zebra_rope(config: ZebraConfig, model_args: Any, logger: Any) -> None:
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
    original = before.get("original_max_position_embeddings", config.max_position_embeddings)
    if model_args.model_max_length is not None:
        if model_args.model_max_length <= original:
            logger.warning_rank0("Input length is smaller than max length. Disabling rope scaling.")
            return
        factor = float(math.ceil(model_args.model_max_length / original))
    else:
        factor = 2.0
    merged = {**before, "rope_type": rope_type, "factor": factor, "original_max_position_embeddings": original}
    if rope_type not in ("yarn", "dynamic", "llama3"):
        del merged["original_max_position_embeddings"]
    if rope_type != "yarn":
        merged = {key: value for key, value in merged.items() if key not in YARN_ONLY_ROPE_KEYS}
    config.rope_parameters = merged
    config.max_position_embeddings = int(original * factor)
    config.validate_rope()
    logger.info_rank0(f"llamafactory-zebra: {rope_type} RoPE factor {factor} on the MLA rope dims ({merged})")

"""The transformers side of the seam door: the entries the plugin adds to transformers' process-wide
registries through their own ``register`` methods (no attribute is replaced there), and the door for the
attention one.

``tests/integration/test_upstream_seams.py`` compares :data:`TRANSFORMERS_REGISTRATIONS` with the registries'
contents after the plugin ran; ``docs/llamafactory.md`` lists it.
"""

from __future__ import annotations

from collections.abc import Callable

from ..attention_policy import FLASH_ATTENTION_2, FLASH_ATTENTION_3
from ..configuration_zebra import ZebraConfig

# Entries the plugin puts into transformers' process-wide registries through their public ``register``
# methods: (registry, key, when). tests/integration/test_upstream_seams.py compares this with the registries' contents
# after the plugin ran; docs/llamafactory.md lists it.
TRANSFORMERS_REGISTRATIONS: tuple[tuple[str, str, str], ...] = (
    ("AutoConfig", ZebraConfig.model_type, "import llamafactory_zebra"),
    ("AutoModel", ZebraConfig.__name__, "import llamafactory_zebra"),
    ("AutoModelForCausalLM", ZebraConfig.__name__, "import llamafactory_zebra"),
    ("AttentionInterface", FLASH_ATTENTION_2, "a distillation teacher loads with FlashAttention"),
    ("AttentionInterface", FLASH_ATTENTION_3, "a distillation teacher loads with FlashAttention"),
)


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

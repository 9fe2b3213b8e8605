"""AMD's released Zebra layout: Qwen3's ``config.json`` plus a ``hybrid_config.json`` with the layer plan.

- ``layout``: which layout a directory is in (``checkpoint_layout``) and the released files read as a
  ``ZebraConfig`` (``load_released_config``); ``ZebraForCausalLM.from_pretrained`` and LLaMA-Factory's
  loader call it, so a released directory loads as it is;
- ``keys``: the weights' key names — which MLA norms they carry, and whether they fit the config;
- ``import_checkpoint``: ``llamafactory-zebra import``, a native copy (``model_type: zebra``);
- ``verify``: ``llamafactory-zebra verify``, which MLA convention the weights fit, by perplexity on
  ``verify_text``.

This package sits below the model: the model imports it to read a released directory. ``verify``
loads the model through transformers' Auto classes, as any user does. The one import up the floors in
the package is ``import_checkpoint`` → ``inventory`` (which builds the model on the meta device): the
import checks a released directory's weight names against the architecture before writing anything,
and the inventory is the one place those names come from. Only ``layout`` and ``keys`` are imported
here, so importing the package never imports the model; ``import_checkpoint``/``verify`` are imported
by their path.
"""

from .layout import (
    NATIVE_LAYOUT,
    RELEASED_HYBRID_CONFIG,
    RELEASED_LAYOUT,
    TOKENIZER_AND_GENERATION_FILES,
    checkpoint_layout,
    load_checkpoint_config,
    load_released_config,
    released_directory_kwargs,
    released_layout_to_kwargs,
)

__all__ = [
    "NATIVE_LAYOUT",
    "RELEASED_HYBRID_CONFIG",
    "RELEASED_LAYOUT",
    "TOKENIZER_AND_GENERATION_FILES",
    "checkpoint_layout",
    "load_checkpoint_config",
    "load_released_config",
    "released_directory_kwargs",
    "released_layout_to_kwargs",
]

"""The parameters a Zebra model has for a config, read off the model itself built on the meta device.

:func:`meta_model` builds that model and :func:`parameter_shapes` lists its weights' names and shapes;
:func:`meta_gdn_mixer` builds one GDN mixer for the converter, which initialises GDN in place of layers
the config may still plan as MLA. ``llamafactory-zebra import`` (the released keys), ``convert`` (every
tensor it writes, every GDN it initialises) and the memory planner (its modules) ask them, so a change to
the layers reaches each of them without a second copy of the layout. A meta-device build allocates
nothing; shapes are cached per configuration because the planner and the converter ask for the same
model many times.

AMD's released checkpoints use the same weight names as this package's native ones: the released
layout differs in its config files and in which MLA norms the weights carry, which ``config.mla_norm``
selects (``released.keys.detect_mla_norm`` reads it from the key names, with the one name list kept
below the model, checked against this one by ``tests/model/test_inventory.py``).

Imports the model, its layers and the config only (torch and transformers, never LLaMA-Factory or vLLM),
so serving code can import it.
"""

from __future__ import annotations

import torch

from .configuration_zebra import ZebraConfig
from .layers.gated_deltanet import ZebraGatedDeltaNet
from .modeling_zebra import ZebraForCausalLM

_SHAPES: dict[str, dict[str, tuple[int, ...]]] = {}


def meta_model(config: ZebraConfig) -> ZebraForCausalLM:
    """``ZebraForCausalLM(config)`` with every parameter on the meta device (no memory, no random draws).

    ``model.to_empty(device=...)`` (or a sub-module's) materialises it when real tensors are needed.
    """
    with torch.device("meta"):
        return ZebraForCausalLM(config)


def meta_gdn_mixer(config: ZebraConfig, layer_idx: int) -> ZebraGatedDeltaNet:
    """One GDN mixer on the meta device, for any ``layer_idx`` (the converter initialises a GDN in place of
    a layer the config may still plan as MLA, while it scores layers)."""
    with torch.device("meta"):
        return ZebraGatedDeltaNet(config, layer_idx)


def parameter_shapes(config: ZebraConfig) -> dict[str, tuple[int, ...]]:
    """Every weight a checkpoint of ``config`` holds (``state_dict`` names, native and released) and its shape.

    ``lm_head.weight`` is listed also when ``tie_word_embeddings`` shares it with the embeddings, as
    ``state_dict()`` lists it.
    """
    key = config.to_json_string(use_diff=False)
    if key not in _SHAPES:
        _SHAPES[key] = {name: tuple(tensor.shape) for name, tensor in meta_model(config).state_dict().items()}
    return dict(_SHAPES[key])


def parameter_names(config: ZebraConfig) -> set[str]:
    """The keys of :func:`parameter_shapes`."""
    return set(parameter_shapes(config))

"""Intermediate-layer distillation (ILD): every student layer, fed the teacher's input to that layer, learns
to reproduce the teacher layer's token-mixer output and layer output.

Stage 1 of AMD's recipe (Zebra-Llama / HyLo; AMD-AGI/AMD-Hybrid-Models ``kd_trainer.py``: per layer, the
L2 norm of the layer-output difference plus that of the attention-output difference, averaged over
tokens, summed over layers). Written here against module hooks so that it needs nothing from either
model's forward code:

- :func:`teacher_layer_states` runs the teacher once per batch under ``no_grad`` with hooks that keep, for
  each decoder layer, its input, its mixer's output (``self_attn`` for a Transformer) and its output.
- :func:`teacher_forced` hooks the student's decoder layers for one forward of the *whole* student (so
  the model builds its own masks, ``cu_seqlens`` and rotary embeddings, DDP and ZeRO-3 see a normal
  forward): each layer's ``hidden_states`` argument is replaced by the teacher's input to that layer, and
  its mixer and layer outputs are recorded. Layers therefore do not depend on each other: with the
  student's (non-reentrant) gradient checkpointing, the backward recomputes one layer at a time — the
  memory of one layer's activations, not the whole graph's.
- :func:`ild_layer_losses` turns the records into one loss per layer, counted on real tokens only
  (padding excluded; packed samples stay apart because both models isolate them in their own forward).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence

import torch
from torch import nn

# Attribute names of a decoder layer's token mixer: Zebra's two, then Transformers' conventions.
MIXER_ATTRIBUTES = ("mla", "gdn", "self_attn", "attention", "mixer")


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a causal LM (unwrapping PEFT), as transformers' ``get_decoder()`` exposes them."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no decoder .layers list; ILD needs one")
    return layers


def mixer_of(layer: nn.Module) -> nn.Module:
    for name in MIXER_ATTRIBUTES:
        module = getattr(layer, name, None)
        if isinstance(module, nn.Module):
            return module
    raise ValueError(f"{type(layer).__name__} has none of the mixer attributes {MIXER_ATTRIBUTES}")


def _first(output):
    return output[0] if isinstance(output, tuple | list) else output


def _hidden_states_argument(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


@dataclasses.dataclass
class LayerStates:
    """Per decoder layer: input, mixer output and layer output (``[B, T, H]`` each)."""

    inputs: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)
    mixer_outputs: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)
    outputs: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)


@contextlib.contextmanager
def _hooks(handles: list) -> Iterator[None]:
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def recording(layers: nn.ModuleList, states: LayerStates, substitute: LayerStates | None = None) -> Iterator[None]:
    """Hooks that fill ``states`` (first call only: checkpoint recomputation does not overwrite) and, with
    ``substitute``, replace each layer's ``hidden_states`` input with ``substitute.inputs[i]``."""
    handles = []
    for index, layer in enumerate(layers):

        def pre_hook(module, args, kwargs, index=index):
            if substitute is None:
                states.inputs.setdefault(index, _hidden_states_argument(args, kwargs))
                return None
            forced = substitute.inputs[index].to(_hidden_states_argument(args, kwargs).dtype)
            if args:
                return (forced, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": forced}

        def mixer_hook(module, args, output, index=index):
            states.mixer_outputs.setdefault(index, _first(output))

        def layer_hook(module, args, output, index=index):
            states.outputs.setdefault(index, _first(output))

        handles.append(layer.register_forward_pre_hook(pre_hook, with_kwargs=True))
        handles.append(mixer_of(layer).register_forward_hook(mixer_hook))
        handles.append(layer.register_forward_hook(layer_hook))
    with _hooks(handles):
        yield


@torch.no_grad()
def teacher_layer_states(teacher: nn.Module, **inputs) -> LayerStates:
    """Run the teacher's decoder (no lm_head) once and keep every layer's input, mixer output and output."""
    states = LayerStates()
    with recording(decoder_layers(teacher), states):
        teacher.get_decoder()(**inputs, use_cache=False)
    return states


@contextlib.contextmanager
def teacher_forced(student: nn.Module, teacher: LayerStates) -> Iterator[LayerStates]:
    """During one student forward: teacher inputs in, the student's mixer and layer outputs recorded."""
    states = LayerStates()
    with recording(decoder_layers(student), states, substitute=teacher):
        yield states


def distance(student: torch.Tensor, teacher: torch.Tensor, token_mask: torch.Tensor, kind: str) -> torch.Tensor:
    """Mean over real tokens of ``‖s − t‖₂`` (``l2``, AMD's) or of ``‖s − t‖² / H`` (``mse``), in fp32+."""
    dtype = torch.promote_types(student.dtype, torch.float32)
    diff = student.to(dtype) - teacher.to(device=student.device, dtype=dtype)
    squared = diff.pow(2).sum(-1)
    if kind == "l2":
        # sqrt has an infinite slope at 0: a student equal to its teacher must get gradient 0, not NaN.
        positive = squared > 0
        per_token = torch.where(positive, squared.clamp_min(torch.finfo(dtype).tiny).sqrt(), squared)
    elif kind == "mse":
        per_token = squared / diff.shape[-1]
    else:
        raise ValueError(f"ild_loss must be l2 or mse, got {kind!r}")
    mask = token_mask.to(dtype)
    return (per_token * mask).sum() / mask.sum().clamp_min(1)


def ild_layer_losses(
    student: LayerStates, teacher: LayerStates, layers: Sequence[int], token_mask: torch.Tensor, kind: str = "l2"
) -> dict[int, torch.Tensor]:
    """Per layer: distance of the mixer outputs + distance of the layer outputs (see :func:`distance`)."""
    return {
        index: distance(student.mixer_outputs[index], teacher.mixer_outputs[index], token_mask, kind)
        + distance(student.outputs[index], teacher.outputs[index], token_mask, kind)
        for index in layers
    }

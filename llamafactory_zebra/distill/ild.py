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
import functools
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


class LayerHooks:
    """Hooks on every decoder layer that record into ``states`` and, while ``substitute`` is set, replace each
    layer's ``hidden_states`` input with ``substitute.inputs[i]``.

    Records keep the first value per layer, so the recomputation of a checkpointed layer in backward changes
    nothing. The hooks stay until :meth:`remove`: with gradient checkpointing the backward re-runs each
    layer, and it must see the same teacher input as the forward did.
    """

    def __init__(self, layers: nn.ModuleList, record_inputs: bool) -> None:
        self.states = LayerStates()
        self.substitute: LayerStates | None = None
        self.handles = []
        for index, layer in enumerate(layers):
            self.handles.append(
                layer.register_forward_pre_hook(
                    functools.partial(self._pre_hook, index, record_inputs), with_kwargs=True
                )
            )
            self.handles.append(
                mixer_of(layer).register_forward_hook(functools.partial(self._record, "mixer_outputs", index))
            )
            self.handles.append(layer.register_forward_hook(functools.partial(self._record, "outputs", index)))

    def _pre_hook(self, index, record_inputs, module, args, kwargs):
        if record_inputs:
            self.states.inputs.setdefault(index, _hidden_states_argument(args, kwargs))
        if self.substitute is None:
            return None
        forced = self.substitute.inputs[index].to(_hidden_states_argument(args, kwargs).dtype)
        if args:
            return (forced, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": forced}

    def _record(self, kind, index, module, args, output):
        getattr(self.states, kind).setdefault(index, _first(output))

    def start(self, substitute: LayerStates | None = None) -> LayerStates:
        """Begin a new forward: fresh records, and the teacher states to feed in (``None``: no substitution)."""
        self.states, self.substitute = LayerStates(), substitute
        return self.states

    def stop(self) -> None:
        self.states, self.substitute = LayerStates(), None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


@torch.no_grad()
def teacher_layer_states(teacher: nn.Module, **inputs) -> LayerStates:
    """Run the teacher's decoder (no lm_head) once and keep every layer's input, mixer output and output."""
    hooks = LayerHooks(decoder_layers(teacher), record_inputs=True)
    try:
        states = hooks.start()
        teacher.get_decoder()(**inputs, use_cache=False)
    finally:
        hooks.remove()
    return states


@contextlib.contextmanager
def teacher_forced(student: nn.Module, teacher: LayerStates) -> Iterator[LayerStates]:
    """For one student forward *and its backward* (run both inside): teacher inputs in, outputs recorded.

    The trainer keeps one :class:`LayerHooks` for the whole run instead (``start`` per step)."""
    hooks = LayerHooks(decoder_layers(student), record_inputs=False)
    try:
        yield hooks.start(teacher)
    finally:
        hooks.remove()


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

"""One record per op: its name, the facts its entries read, its entry points, the phases that run it, the facts of
the call a run of the recipe makes to it, and where it is used.

Why one record: an op used to be described in five tables of four files (its name, its facts, its phases, an
``if``/``elif`` branch per op for a recipe's call, and a table of uses in the kernel-table tool), which a new op had
to find and fill alike. Here a new op is one :class:`OpSpec` (and its name in ``kernel_names.Op``); the decider
refuses a call with a fact its op does not list, ``resolve()`` prints the ops of each phase in :data:`OP_SPECS`'
order and builds their calls from :attr:`OpSpec.recipe`, and ``docs/gpu.md``'s kernel table says where each is used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from ..kernel_names import EntryPoint, Fact, Op
from .stack import Stack

TRAINING, INFERENCE, SERVING = "training", "inference", "serving (vLLM)"
PHASES = (TRAINING, INFERENCE, SERVING)


@dataclass(frozen=True)
class Recipe:
    """What a run of the recipe settles before any op runs: the machine, the attention implementation
    LLaMA-Factory gives the model, and whether the loss is fused (``enable_liger_kernel``)."""

    stack: Stack
    attn_implementation: str
    liger_enabled: bool


def _no_facts(_: Recipe) -> Mapping[Fact, object]:
    return {}


@dataclass(frozen=True)
class OpSpec:
    op: Op
    uses: str  # where it runs, as docs/gpu.md's kernel table says it
    phases: frozenset[str]  # the phases whose doctor table shows it (:data:`PHASES`)
    facts: frozenset[Fact] = frozenset()  # the facts its entries read (``Call.fact``); a call naming another fails
    entry_points: tuple[EntryPoint, ...] = (EntryPoint.RUN,)  # where it is entered (``decider.run``)
    recipe: Callable[[Recipe], Mapping[Fact, object]] = _no_facts  # the facts of a recipe run's call to it


OP_SPECS: Mapping[Op, OpSpec] = {
    spec.op: spec
    for spec in (
        OpSpec(Op.GDN_CHUNK, "training, prefill", frozenset({TRAINING, INFERENCE})),
        OpSpec(Op.GDN_RECURRENT, "HF decode", frozenset({INFERENCE})),
        OpSpec(
            Op.CONV,
            "GDN short conv, sequences and decode steps",
            frozenset({TRAINING, INFERENCE}),
            entry_points=(EntryPoint.SEQUENCE, EntryPoint.STEP),
        ),
        OpSpec(
            Op.GDN_PREFILL_IN_SLOTS,
            "vLLM",
            frozenset({SERVING}),
            frozenset({Fact.STATE_DTYPE, Fact.GRAD}),
            recipe=lambda recipe: {Fact.STATE_DTYPE: torch.float32},
        ),
        OpSpec(
            Op.GDN_DECODE_STEP,
            "vLLM",
            frozenset({SERVING}),
            frozenset({Fact.STATE_DTYPE, Fact.STATE_ROWS_CONTIGUOUS, Fact.GRAD}),
            # vLLM keeps the SSM state in fp32 (``mamba_ssm_cache_dtype: auto``), each row contiguous in V.
            recipe=lambda recipe: {Fact.STATE_DTYPE: torch.float32, Fact.STATE_ROWS_CONTIGUOUS: True},
        ),
        OpSpec(
            Op.CONV_IN_SLOTS,
            "vLLM",
            frozenset({SERVING}),
            frozenset({Fact.WIDTH, Fact.CONV_STATE_DIM_FIRST, Fact.VLLM_CPU_PLATFORM}),
            entry_points=(EntryPoint.STEP, EntryPoint.PREFILL),
            # Zebra's 4-wide conv in vLLM's default conv-state layout.
            recipe=lambda recipe: {
                Fact.WIDTH: 4,
                Fact.CONV_STATE_DIM_FIRST: False,
                Fact.VLLM_CPU_PLATFORM: not recipe.stack.has_gpu,
            },
        ),
        OpSpec(Op.LATENT_DECODE, "vLLM, latent MLA cache", frozenset({SERVING})),
        OpSpec(
            Op.GATED_NORM,
            "HF inference, vLLM on CPU",
            frozenset({INFERENCE, SERVING}),
            frozenset({Fact.GRAD, Fact.SAME_GATE}),
            # No gradient (inference), the gate as wide as the values.
            recipe=lambda recipe: {Fact.GRAD: False, Fact.SAME_GATE: True},
        ),
        OpSpec(
            Op.ATTENTION,
            "MLA, packed rows",
            frozenset({TRAINING, INFERENCE}),
            frozenset({Fact.ATTN_IMPLEMENTATION}),
            recipe=lambda recipe: {Fact.ATTN_IMPLEMENTATION: recipe.attn_implementation},
        ),
        OpSpec(
            Op.LOSS,
            "training, `enable_liger_kernel`",
            frozenset({TRAINING}),
            frozenset({Fact.FUSED}),
            recipe=lambda recipe: {Fact.FUSED: recipe.liger_enabled},
        ),
        OpSpec(Op.DISTILLATION_LOSS, "`distill: kd`", frozenset({TRAINING})),
    )
}
OPS: tuple[Op, ...] = tuple(OP_SPECS)
# The ops each phase runs, in the order doctor prints them.
PHASE_OPS: Mapping[str, tuple[Op, ...]] = {
    phase: tuple(op for op, spec in OP_SPECS.items() if phase in spec.phases) for phase in PHASES
}

"""The environment switches kernel choice reads, as data: which variable, its values, and what each value
does to which registry entries (``decider.py`` applies them; ``doctor`` names the one that decided).

A value *allows* a set of the governed entries (by key or family; the others are left out), may *force*
them (they run even where the automatic rule would not pick them, e.g. the GPU-shaped PyTorch GDN on a
CPU) and may be *strict* (nothing else stands in when they cannot run: the op raises, training stops).
Entries a switch does not govern are untouched by it. Every switch is read at each call, so a test or a
user can flip it in one process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..attention_policy import SDPA
from ..kernel_names import Fact, Family, Key, Op
from .registry import TRITON_INTERPRET_ENV_VAR

AUTO = "auto"


@dataclass(frozen=True)
class SwitchValue:
    allows: frozenset[str] | None = None  # keys or families of the governed entries left in; None: all of them
    forces: bool = False
    strict: bool = False


@dataclass(frozen=True)
class Switch:
    env_var: str
    ops: tuple[Op, ...]  # the ops it governs
    governs: frozenset[Key | Family]  # keys or families of those ops' entries it governs
    values: Mapping[str, SwitchValue]
    applies: Callable[[Mapping[str, object]], bool] = field(default=lambda details: True)  # to a call's details
    doc: str = ""
    fix: str = ""  # what to do when a strict value cannot be met

    def value(self) -> str:
        """The variable's value, ``auto`` when unset; anything not in :attr:`values` is refused, naming them."""
        choice = os.environ.get(self.env_var, AUTO).strip().lower() or AUTO
        if choice not in self.values:
            raise ValueError(f"{self.env_var}={choice!r} is not valid; use one of {', '.join(self.values)}.")
        return choice


def _only(*names: Key | Family, strict: bool = False) -> SwitchValue:
    return SwitchValue(frozenset(names), forces=True, strict=strict)


# The GDN ops' backend: fla's Triton kernels or this package's PyTorch (and C++) code.
BACKEND_ENV_VAR = "ZEBRA_GDN_BACKEND"
GDN_BACKEND = Switch(
    BACKEND_ENV_VAR,
    ops=(Op.GDN_CHUNK, Op.GDN_RECURRENT, Op.CONV, Op.GDN_PREFILL_IN_SLOTS, Op.GDN_DECODE_STEP),
    governs=frozenset({Family.FLA, Family.TORCH, Family.CPP}),
    values={
        AUTO: SwitchValue(),
        "torch": SwitchValue(frozenset({Family.TORCH, Family.CPP})),
        "fla": _only(Family.FLA, strict=True),
    },
    doc="auto: fla's kernels for GPU tensors, PyTorch elsewhere; torch: never fla; fla: fla or a clear error "
    f"(CPU tensors too, under Triton's interpreter: {TRITON_INTERPRET_ENV_VAR}=1)",
    fix=f"install fla-core on a CUDA or ROCm GPU machine, or set {BACKEND_ENV_VAR}=auto",
)

# Which exact PyTorch formulation of the chunked gated delta rule runs when fla does not: ``chunk``
# (``chunk.py``, tuned for CPU threads, faster there: docs/benchmarks.md), ``parallel``
# (``chunk_parallel.py``, whole-chunk batched work and one GEMM a chunk step, shaped for GPUs),
# ``parallel-compiled`` (its whole-chunk parts under torch.compile; opt-in, compiling costs tens of seconds
# per process). ``auto`` picks ``parallel`` for GPU tensors and ``chunk`` elsewhere.
TORCH_CHUNK_ENV_VAR = "ZEBRA_GDN_TORCH_CHUNK"
TORCH_CHUNK = Switch(
    TORCH_CHUNK_ENV_VAR,
    ops=(Op.GDN_CHUNK,),
    governs=frozenset({Key.TORCH_CHUNK, Key.TORCH_PARALLEL, Key.TORCH_PARALLEL_COMPILED}),
    values={
        AUTO: SwitchValue(),
        "chunk": _only(Key.TORCH_CHUNK),
        "parallel": _only(Key.TORCH_PARALLEL),
        "parallel-compiled": _only(Key.TORCH_PARALLEL_COMPILED),
    },
    doc="the PyTorch GDN formulation: auto (parallel on GPUs, chunk elsewhere), chunk, parallel, parallel-compiled",
)

# The package's C++ CPU kernels for inference (``ops/cpu/``: serving's GDN decode step and prompt
# chunks, the gated RMSNorm): ``auto`` builds them on first use and runs them where they fit, ``torch`` keeps
# their PyTorch paths.
CPU_KERNELS_ENV_VAR = "ZEBRA_CPU_KERNELS"
CPU_KERNELS = Switch(
    CPU_KERNELS_ENV_VAR,
    ops=(Op.GDN_DECODE_STEP, Op.GDN_PREFILL_IN_SLOTS, Op.GATED_NORM),
    governs=frozenset({Family.CPP}),
    values={AUTO: SwitchValue(), "torch": SwitchValue(frozenset())},
    doc="the C++ CPU kernels: auto (built on first use, run where they fit), torch (their PyTorch paths)",
)

# sdpa's kernel for packed rows (``attention_policy.py`` names them): the flex path has not yet run on a
# GPU in this project's tests (docs/gpu.md), so a user can step around it.
PACKED_SDPA_ENV_VAR = "ZEBRA_PACKED_SDPA"
PACKED_SDPA = Switch(
    PACKED_SDPA_ENV_VAR,
    ops=(Op.ATTENTION,),
    governs=frozenset({Key.FLEX_BLOCK_MASK, Key.SDPA_PER_SEGMENT, Key.DENSE_MASK}),
    values={
        AUTO: SwitchValue(),
        "flex": _only(Key.FLEX_BLOCK_MASK),
        "per_segment": _only(Key.SDPA_PER_SEGMENT),
        "dense_mask": _only(Key.DENSE_MASK),
    },
    applies=lambda details: details.get(Fact.ATTN_IMPLEMENTATION) == SDPA,
    doc="sdpa's packed-row kernel: auto (flex on GPUs, per-segment sdpa elsewhere), flex, per_segment, dense_mask",
)

SWITCHES: tuple[Switch, ...] = (GDN_BACKEND, TORCH_CHUNK, CPU_KERNELS, PACKED_SDPA)

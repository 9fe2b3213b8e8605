"""The kernel registry's table: one entry per op × implementation, with the code it runs. Adding an entry is adding
a row to :data:`KERNELS` and writing its function.

Modelled on fla's ``fla/backends``: each :class:`Kernel` names its op, its implementation's key and
family, a priority (lower first), the distribution it needs, three predicates — whether the machine
can run it (:attr:`Kernel.needs`, on the probed :class:`~.stack.Stack`), whether it takes this call at all
(:attr:`Kernel.fits`: device type, dtype, shapes of the inputs, as a :class:`Call`) and whether the
automatic rule picks it for this call (:attr:`Kernel.auto`, e.g. the GPU-shaped PyTorch GDN only for
GPU tensors) — and its code (:attr:`Kernel.code`: ``module:function`` per entry point of the op, imported when
it first runs, so this table imports no op). ``decider.py``'s ``select`` is the one decider and its ``run``
calls the chosen entry's function; the switches (``switches.py``) leave entries out or force them. A call's
facts are all an entry reads, so a faked CUDA or ROCm stack is decided on a CPU machine exactly as on the GPU
(``tests/kernels/test_kernel_matrix.py``).

Each entry key is spelled once, in its row here; :class:`Key` is derived from the rows, and the switches,
the losses, the attention policy's users and the vLLM layer name its members. ``docs/gpu.md``'s kernel table
is generated from the rows (``python tools/kernel_table.py --write``; ``tests/repo/test_docs_tables.py``
compares).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from ..attention_policy import FLASH_ATTENTION_BACKENDS, SDPA
from ..kernel_names import Fact, Family, Name, Op
from .stack import Stack

# The ops and families (``kernel_names.py`` spells them), under the names the rest of the package imports.
GDN_CHUNK, GDN_RECURRENT, CONV = Op.GDN_CHUNK, Op.GDN_RECURRENT, Op.CONV
GDN_PREFILL_IN_SLOTS, GDN_DECODE_STEP, CONV_IN_SLOTS = Op.GDN_PREFILL_IN_SLOTS, Op.GDN_DECODE_STEP, Op.CONV_IN_SLOTS
GATED_NORM, ATTENTION, LOSS, DISTILLATION_LOSS = Op.GATED_NORM, Op.ATTENTION, Op.LOSS, Op.DISTILLATION_LOSS
OPS = tuple(Op)
FLA, TORCH, CPP, VLLM, FLASH_ATTN = Family.FLA, Family.TORCH, Family.CPP, Family.VLLM, Family.FLASH_ATTN
FAMILIES = tuple(Family)

FLA_INSTALL = "pip install fla-core  (the plugin's `gpu` extra pins the tested range)"
# Where the one GPU measurement of the PyTorch GDN path is (the full Zebra against a same-width Qwen3-1.7B,
# training tokens/s on one H200): what the fla-missing warning and the known issues' fix point the user to.
TORCH_GDN_GPU_COST = (
    'its GPU training speed: docs/benchmarks.md, "One H200: fla, and training with the PyTorch GDN path"'
)
FLA_MISSING = "fla-missing-on-gpu"
TRITON_INTERPRET_ENV_VAR = "TRITON_INTERPRET"
# The entry point of an op with one (``decider.run``'s default); ``conv`` and ``conv in slots`` name theirs.
RUN = "run"


def triton_interpreter_enabled() -> bool:
    """Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``, as triton itself parses it)."""
    return os.environ.get(TRITON_INTERPRET_ENV_VAR, "0").strip().lower() in ("1", "true", "on", "yes")


@dataclass(frozen=True)
class Call:
    """What an op is about to run: its inputs' device type as torch names it (``cuda`` on ROCm too), their
    dtype, and the op's own facts (``details``, named by :class:`~..kernel_names.Fact`: a state's dtype, the
    attention implementation, …; :func:`select` refuses a fact its op does not declare in :data:`FACTS`)."""

    device_type: str
    dtype: torch.dtype | None = None
    details: tuple[tuple[str, object], ...] = ()

    @classmethod
    def of(cls, tensor, **details: object) -> Call:
        return cls(tensor.device.type, tensor.dtype, tuple(sorted(details.items())))

    @classmethod
    def on(cls, device_type: str, dtype: torch.dtype | None = None, **details: object) -> Call:
        return cls(device_type, dtype, tuple(sorted(details.items())))

    @property
    def facts(self) -> Mapping[str, object]:
        return dict(self.details)

    def fact(self, name: Fact, default: object = None) -> object:
        """One fact of the call, ``default`` when the caller did not give it."""
        return self.facts.get(name, default)

    @property
    def on_gpu(self) -> bool:
        return self.device_type == "cuda"


def _always(_: object) -> str | None:
    return None


@dataclass(frozen=True)
class Kernel:
    op: Op
    key: str  # the implementation's name within its op (spelled here only; ``Key`` names it elsewhere)
    label: str  # what doctor prints
    family: Family
    priority: int  # lower first
    requires: str | None = None  # the pip distribution it needs
    needs: Callable[[Stack], str | None] = _always  # why this machine cannot run it (None: it can)
    fits: Callable[[Call], str | None] = _always  # why it does not take this call
    auto: Callable[[Call], str | None] = _always  # why the automatic rule passes it over for this call
    because: Callable[[Stack], str] = lambda stack: ""  # why it runs, when it is the first choice
    missing_warning: str | None = None  # warn (this key, once) when only its absence passes it over
    # Its function per entry point of the op, as ``module:function`` (``code``); none: the op's caller does the
    # work itself (the dense attention mask).
    code: Mapping[str, str] = field(default_factory=dict, compare=False)
    when: str = ""  # when the automatic rule runs it, in words (docs/gpu.md's kernel table)

    def function(self, entry_point: str = RUN) -> Callable:
        """The function the entry runs at ``entry_point``, from its module (imported the first time)."""
        module, name = self.code[entry_point].split(":")
        return getattr(importlib.import_module(module), name)


def code(module: str, function: str | None = None, **entry_points: str) -> Mapping[str, str]:
    """An entry's :attr:`Kernel.code`: ``function`` of ``module`` for an op with one entry point, else a function
    per entry point (a ``module:function`` value names one of another module)."""
    functions = {RUN: function} if function else entry_points
    return {point: name if ":" in name else f"{module}:{name}" for point, name in functions.items()}


def implementations(op: str) -> tuple[str, ...]:
    """The keys of ``op``'s entries, by priority."""
    return tuple(k.key for k in sorted((k for k in KERNELS if k.op == op), key=lambda k: k.priority))


# --- the predicates the entries share ---------------------------------------------------------------


def _triton_needs(stack: Stack) -> str | None:
    """Triton kernels (fla, Liger) run on a CUDA/ROCm GPU, or on the CPU under Triton's interpreter."""
    if stack.has_gpu or triton_interpreter_enabled():
        return None
    return "no GPU (its kernels are Triton)"


def _triton_fits(call: Call) -> str | None:
    if call.on_gpu or (call.device_type == "cpu" and triton_interpreter_enabled()):
        return None
    return f"{call.device_type} inputs (Triton kernels need a GPU, or {TRITON_INTERPRET_ENV_VAR}=1)"


def _gpu_call(call: Call) -> str | None:
    return None if call.on_gpu else f"{call.device_type} inputs (the automatic rule keeps it to GPUs)"


def _fla_because(stack: Stack) -> str:
    triton = stack.version("triton")
    installed = f"fla-core {stack.version('fla-core')}" + (f", triton {triton}" if triton else "")
    if not stack.has_gpu:
        return f"{installed} under Triton's CPU interpreter ({TRITON_INTERPRET_ENV_VAR}=1)"
    return f"{installed} on {stack.device.upper()}"


def _triton(op: Op, family: Family, label: str, requires: str, **more) -> Kernel:
    """A Triton entry (fla's, Liger's), keyed by its family: first choice for GPU tensors; CPU ones only when
    demanded, under Triton's interpreter."""
    more = {"needs": _triton_needs, "fits": _triton_fits, "when": "GPU tensors"} | more
    return Kernel(op, family.value, label, family, 0, requires=requires, auto=_gpu_call, **more)


def _fla(op: Op, label: str, code: Mapping[str, str]) -> Kernel:
    return _triton(op, FLA, label, "fla-core", because=_fla_because, missing_warning=FLA_MISSING, code=code)


def _linux_compiler(stack: Stack) -> str | None:
    if not stack.platform.startswith("linux"):
        return f"not Linux ({stack.platform})"
    return None if stack.compiler else "no C++ compiler (CXX or c++) to build it"


def _cpu_inference(call: Call) -> str | None:
    """The C++ CPU kernels' common ground: CPU bf16 or fp32 inputs, nothing that needs a gradient."""
    if call.device_type != "cpu" or call.dtype not in (torch.bfloat16, torch.float32):
        return f"{call.device_type} {call.dtype} inputs (it takes bf16 or fp32 on a CPU)"
    return "inputs that need a gradient" if call.fact(Fact.GRAD) else None


def _cpu_step_fits(call: Call) -> str | None:
    """The C++ decode step: an fp32 or bf16 state with rows of V contiguous (vLLM's SSM cache as the layer views
    it)."""
    state_dtype = call.fact(Fact.STATE_DTYPE)
    if state_dtype not in (torch.float32, torch.bfloat16):
        return f"a {state_dtype} state (it takes fp32 or bf16)"
    if not call.fact(Fact.STATE_ROWS_CONTIGUOUS):
        return "state rows not contiguous in V"
    return _cpu_inference(call)


def _cpu_prefill_fits(call: Call) -> str | None:
    """The C++ prefill: an fp32 state."""
    if call.fact(Fact.STATE_DTYPE) != torch.float32:
        return f"a {call.fact(Fact.STATE_DTYPE)} state (it takes fp32)"
    return _cpu_inference(call)


def _bf16_gemm_fits(call: Call) -> str | None:
    if call.device_type != "cpu" or call.dtype != torch.bfloat16:
        return f"{call.device_type} {call.dtype} inputs (it takes bf16 on a CPU)"
    return None


def _bf16_dot_products(stack: Stack) -> str | None:
    return None if stack.cpu_bf16_dot_products else "this CPU has no bf16 dot products (AVX-512-BF16, AMX, Arm bf16)"


def _cpp(op: Op, key: str, label: str, priority: int, fits: Callable[[Call], str | None], **more) -> Kernel:
    """An entry of the package's C++ CPU extension (``ops/cpu/``): built on first use with the
    machine's compiler; a build that fails passes it over (``KernelLoadError``) with one warning."""
    return Kernel(
        op,
        key,
        label,
        CPP,
        priority,
        needs=more.pop("needs", _linux_compiler),
        fits=fits,
        because=more.pop("because", lambda stack: f"on a CPU, built with {stack.compiler}"),
        **more,
    )


def _vllm_conv_needs(stack: Stack) -> str | None:
    return _bf16_dot_products(stack)


def _vllm_conv_fits(call: Call) -> str | None:
    if not call.fact(Fact.VLLM_CPU_PLATFORM):
        return "not vLLM's CPU platform"
    if call.dtype != torch.bfloat16 or call.fact(Fact.WIDTH) != 4:
        return f"{call.dtype} activations, width {call.fact(Fact.WIDTH)} (it takes bf16, width 4)"
    return "a dim-first conv state layout" if call.fact(Fact.CONV_STATE_DIM_FIRST) else None


def _attention(*implementations: str) -> Callable[[Call], str | None]:
    def fits(call: Call) -> str | None:
        name = call.fact(Fact.ATTN_IMPLEMENTATION)
        return None if name in implementations else f"attn_implementation {name}"

    return fits


def _fused(wanted: bool) -> Callable[[Call], str | None]:
    def fits(call: Call) -> str | None:
        if bool(call.fact(Fact.FUSED, True)) == wanted:
            return None
        return "enable_liger_kernel: false (transformers' loss)" if wanted else "fused cross-entropy is on"

    return fits


def _liger(op: Op, label: str, code: Mapping[str, str]) -> Kernel:
    return _triton(
        op,
        Family.LIGER,
        label,
        "liger-kernel",
        fits=lambda call: _fused(True)(call) or _triton_fits(call),
        because=lambda stack: f"liger-kernel {stack.version('liger-kernel')}",
        code=code,
        when="GPU",
    )


# The facts each op's entries read (``Call.fact``); a call that names another is refused, so a misspelt fact
# fails at its first call instead of reading as absent and passing an entry over with a plausible reason.
FACTS: Mapping[Op, frozenset[Fact]] = {
    Op.GDN_CHUNK: frozenset(),
    Op.GDN_RECURRENT: frozenset(),
    Op.CONV: frozenset(),
    Op.GDN_PREFILL_IN_SLOTS: frozenset({Fact.STATE_DTYPE, Fact.GRAD}),
    Op.GDN_DECODE_STEP: frozenset({Fact.STATE_DTYPE, Fact.STATE_ROWS_CONTIGUOUS, Fact.GRAD}),
    Op.CONV_IN_SLOTS: frozenset({Fact.WIDTH, Fact.CONV_STATE_DIM_FIRST, Fact.VLLM_CPU_PLATFORM}),
    Op.GATED_NORM: frozenset({Fact.GRAD, Fact.SAME_GATE}),
    Op.ATTENTION: frozenset({Fact.ATTN_IMPLEMENTATION}),
    Op.LOSS: frozenset({Fact.FUSED}),
    Op.DISTILLATION_LOSS: frozenset(),
}

# Where the entries' functions live (:func:`code`).
GDN = "llamafactory_zebra.ops.gated_delta_rule"
DISPATCH, IN_SLOTS = f"{GDN}.dispatch", f"{GDN}.in_slots"
CONV_OP = "llamafactory_zebra.ops.causal_conv1d"
NORM = "llamafactory_zebra.ops.gated_rms_norm"
CPU = "llamafactory_zebra.ops.cpu"
VLLM_LAYER = "llamafactory_zebra.serving.vllm.gdn"
MLA = "llamafactory_zebra.layers.mla"
LOSSES, KD_LOSSES = "llamafactory_zebra.loss", "llamafactory_zebra.distill.kd_loss"

KERNELS: tuple[Kernel, ...] = (
    # Training / prefill: the chunked gated delta rule (ops/gated_delta_rule/dispatch.py).
    _fla(GDN_CHUNK, "fla chunk_gated_delta_rule", code(DISPATCH, "fla_chunk_gated_delta_rule")),
    Kernel(GDN_CHUNK, "torch-parallel-compiled", "PyTorch chunked GDN (parallel-compiled)", TORCH, 1,
           auto=lambda call: "opt-in (compiling costs tens of seconds per process)",
           code=code(DISPATCH, "chunk_gated_delta_rule_parallel_compiled"), when="opt-in"),
    Kernel(GDN_CHUNK, "torch-parallel", "PyTorch chunked GDN (parallel)", TORCH, 2, auto=_gpu_call,
           code=code(f"{GDN}.chunk_parallel", "chunk_gated_delta_rule_parallel"), when="GPU tensors"),
    Kernel(GDN_CHUNK, "torch-chunk", "PyTorch chunked GDN (chunk)", TORCH, 3,
           code=code(f"{GDN}.chunk", "chunk_gated_delta_rule_torch")),
    # Decoding a few tokens (HF generate): the token-by-token rule.
    _fla(GDN_RECURRENT, "fla fused_recurrent_gated_delta_rule",
         code(DISPATCH, "fla_fused_recurrent_gated_delta_rule")),
    Kernel(GDN_RECURRENT, "torch", "PyTorch recurrent GDN", TORCH, 1,
           code=code(f"{GDN}.fused_recurrent", "fused_recurrent_gated_delta_rule_torch")),
    # GDN's short convolution, whole sequences and decode steps (ops/causal_conv1d.py).
    _fla(CONV, "fla causal_conv1d", code(CONV_OP, sequence="_causal_conv1d_fla", step="_causal_conv1d_update_fla")),
    Kernel(CONV, "torch", "PyTorch causal conv", TORCH, 1,
           code=code(CONV_OP, sequence="_causal_conv1d_torch", step="_causal_conv1d_update_torch")),
    # Serving (vLLM) prompt chunks on state slots (ops/gated_delta_rule/in_slots.py, chunk_prefill.py): bf16 GEMM
    # operands for bf16 inputs on a CPU with bf16 dot products, as fla feeds its dot products on a GPU.
    _fla(GDN_PREFILL_IN_SLOTS, "fla chunk_gated_delta_rule on gathered slots", code(IN_SLOTS, "_prefill_fla")),
    _cpp(GDN_PREFILL_IN_SLOTS, "cpp-bf16-gemm", "C++ prefill on the slots (cpu_prefill.cpp), bf16 GEMM operands", 1,
         lambda call: _cpu_prefill_fits(call) or _bf16_gemm_fits(call),
         needs=lambda stack: _linux_compiler(stack) or _bf16_dot_products(stack),
         because=lambda stack: f"bf16 inputs on a CPU with bf16 dot products, built with {stack.compiler}",
         code=code(IN_SLOTS, "prefill_cpp_bf16_gemm"),
         when="bf16 inputs, fp32 state, a CPU with bf16 dot products, Linux, a C++ compiler"),
    _cpp(GDN_PREFILL_IN_SLOTS, "cpp", "C++ prefill on the slots (cpu_prefill.cpp)", 2, _cpu_prefill_fits,
         code=code(IN_SLOTS, "prefill_cpp"), when="bf16 or fp32 inputs, fp32 state"),
    Kernel(GDN_PREFILL_IN_SLOTS, "torch-bf16-gemm", "PyTorch prefill on the slots, bf16 GEMM operands", TORCH, 3,
           needs=_bf16_dot_products, fits=_bf16_gemm_fits,
           because=lambda stack: "bf16 inputs on a CPU with bf16 dot products",
           code=code(IN_SLOTS, "prefill_torch_bf16_gemm"), when="bf16 inputs, a CPU with bf16 dot products"),
    Kernel(GDN_PREFILL_IN_SLOTS, "torch", "PyTorch prefill on the slots (chunk_prefill.py)", TORCH, 4,
           code=code(f"{GDN}.chunk_prefill", "chunk_gated_delta_rule_prefill")),
    # Serving decode tokens on state slots.
    _fla(GDN_DECODE_STEP, "fla fused_recurrent_gated_delta_rule on gathered slots", code(IN_SLOTS, "_step_fla")),
    _cpp(GDN_DECODE_STEP, "cpp", "C++ decode step in place (cpu_step.cpp)", 1, _cpu_step_fits,
         code=code(f"{CPU}.cpu_step", "cpu_step_in_slots"),
         when="bf16 or fp32 inputs, fp32 or bf16 state, Linux, a C++ compiler"),
    Kernel(GDN_DECODE_STEP, "torch", "PyTorch decode step in place", TORCH, 2, code=code(IN_SLOTS, "_step_torch")),
    # Serving's conv on state slots (serving/vllm/gdn.py): vLLM's C++ conv, else this package's conv op.
    Kernel(CONV_IN_SLOTS, "vllm-cpp", "vLLM's C++ causal conv (causal_conv1d_*_cpu)", VLLM, 0,
           requires="vllm", needs=_vllm_conv_needs, fits=_vllm_conv_fits,
           because=lambda stack: f"vllm {stack.version('vllm')} on a CPU with bf16 dot products, bf16 inputs, "
                                 "width 4",
           code=code(VLLM_LAYER, step="_vllm_conv_step", prefill="_vllm_conv_prefill"),
           when="vLLM's CPU platform, bf16, width 4, bf16 dot products"),
    Kernel(CONV_IN_SLOTS, "conv-op", "the conv op on the slots (fla on GPUs, PyTorch elsewhere)", TORCH, 1,
           code=code(VLLM_LAYER, step=f"{CONV_OP}:causal_conv1d_update_in_slots", prefill="_conv_op_prefill")),
    # The gated RMSNorm closing a GDN layer (ops/gated_rms_norm.py; the vLLM layer on a GPU runs vLLM's own).
    _cpp(GATED_NORM, "cpp", "C++ one-pass gated RMSNorm (gated_rms_norm.cpp)", 0,
         lambda call: _cpu_inference(call) or (None if call.fact(Fact.SAME_GATE) else "a gate of another dtype"),
         code=code(f"{CPU}.gated_rms_norm", "cpu_gated_rms_norm"), when="CPU, bf16 or fp32, no gradient"),
    Kernel(GATED_NORM, "torch", "PyTorch gated RMSNorm", TORCH, 1, code=code(NORM, "gated_rms_norm_reference")),
    # MLA over packed rows (layers/mla.py), named as attention_policy.py names them; the dense mask is the model's
    # own attention function with a [B, 1, T, T] mask (no code of its own).
    Kernel(ATTENTION, "flash_varlen", "FlashAttention varlen", FLASH_ATTN, 0,
           fits=_attention(*FLASH_ATTENTION_BACKENDS), code=code(MLA, "flash_attention_forward"),
           when="`flash_attention_2/3`"),
    Kernel(ATTENTION, "flex_block_mask", "flex_attention on the samples' borders", Family.FLEX, 1,
           fits=_attention(SDPA), auto=_gpu_call, code=code(MLA, "flex_sdpa_attention"), when="sdpa, GPU tensors"),
    Kernel(ATTENTION, "sdpa_per_segment", "one sdpa call per sample", Family.SDPA, 2, fits=_attention(SDPA),
           code=code(MLA, "per_segment_sdpa_attention"), when="sdpa"),
    Kernel(ATTENTION, "dense_mask", "a dense block-causal mask", Family.DENSE, 3),
    # The training loss from hidden states (loss.py); ``fused`` is LLaMA-Factory's enable_liger_kernel.
    _liger(LOSS, "Liger fused linear CE", code(LOSSES, "liger_linear_cross_entropy_sum")),
    Kernel(LOSS, "chunked", "chunked PyTorch CE", Family.CHUNKED, 1, fits=_fused(True),
           code=code(LOSSES, "chunked_linear_cross_entropy_sum")),
    Kernel(LOSS, "logits", "full-logit cross-entropy", Family.LOGITS, 2, fits=_fused(False),
           code=code(LOSSES, "logits_cross_entropy_sum"), when="`enable_liger_kernel: false`"),
    # Logit distillation (distill/kd_loss.py).
    _liger(DISTILLATION_LOSS, "Liger fused linear JSD", code(KD_LOSSES, "_liger_kd_loss_sums")),
    Kernel(DISTILLATION_LOSS, "chunked", "chunked PyTorch KL", Family.CHUNKED, 1,
           code=code(KD_LOSSES, "_chunked_kd_loss_sums")),
)  # fmt: skip

# Each entry key as a member (``Key.TORCH_CHUNK == "torch-chunk"``), for the switches, the losses, the model and
# the vLLM layer: derived from the rows, so a key is spelled in its row only.
Key = Name("Key", {kernel.key.upper().replace("-", "_"): kernel.key for kernel in KERNELS})
# The attention entries that take the samples' borders (``cu_seq_lens_q/k``) instead of a mask.
BORDER_KERNELS = (Key.FLASH_VARLEN, Key.FLEX_BLOCK_MASK, Key.SDPA_PER_SEGMENT)

"""The kernel registry's table: one entry per op × implementation, with the rules that choose it. Adding an entry is
adding a row to :data:`KERNELS`, its key to ``kernel_names.Key`` and its function to its op's binding.

Modelled on fla's ``fla/backends``: each :class:`Kernel` names its op, its implementation's key and
family, a priority (lower first), the distribution it needs and three predicates — whether the machine
can run it (:attr:`Kernel.needs`, on the probed :class:`~.stack.Stack`), whether it takes this call at all
(:attr:`Kernel.fits`: device type, dtype, shapes of the inputs, as a :class:`Call`) and whether the
automatic rule picks it for this call (:attr:`Kernel.auto`, e.g. the GPU-shaped PyTorch GDN only for
GPU tensors). The code is not named here: the module that runs an op binds its entries' functions as objects
when it is imported (``kernels.bind``, ``bindings.py``), so this table imports nothing above ``kernels/`` and the
import graph shows every edge. ``decider.py``'s ``select`` is the one decider and its ``run`` calls the chosen
entry's bound function; the switches (``switches.py``) leave entries out or force them. A call's facts are all an
entry reads, so a faked CUDA or ROCm stack is decided on a CPU machine exactly as on the GPU
(``tests/kernels/test_kernel_matrix.py``).

The attention entries carry what choosing them means for the caller (:attr:`Kernel.reads_borders`,
:attr:`Kernel.ignores_masks`, :attr:`Kernel.needs_mask`), so the model, sequence parallelism and the memory
planner read the chosen entry's properties instead of comparing keys. ``docs/gpu.md``'s kernel table is generated
from the rows (``python tools/kernel_table.py --write``; ``tests/repo/test_docs_tables.py`` compares).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from ..attention_policy import FLASH_ATTENTION_BACKENDS, SDPA
from ..kernel_names import Fact, Family, Key, Op
from .stack import Stack

FLA_INSTALL = "pip install fla-core  (the plugin's `gpu` extra pins the tested range)"
# Where the one GPU measurement of the PyTorch GDN path is (the full Zebra against a same-width Qwen3-1.7B,
# training tokens/s on one H200): what the fla-missing warning and the known issues' fix point the user to.
TORCH_GDN_GPU_COST = (
    'its GPU training speed: docs/benchmarks.md, "One H200: fla, and training with the PyTorch GDN path"'
)
FLA_MISSING = "fla-missing-on-gpu"
TRITON_INTERPRET_ENV_VAR = "TRITON_INTERPRET"


def triton_interpreter_enabled() -> bool:
    """Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``, as triton itself parses it)."""
    return os.environ.get(TRITON_INTERPRET_ENV_VAR, "0").strip().lower() in ("1", "true", "on", "yes")


@dataclass(frozen=True)
class Call:
    """What an op is about to run: its inputs' device type as torch names it (``cuda`` on ROCm too), their
    dtype, and the op's own facts (``details``, named by :class:`~..kernel_names.Fact`: a state's dtype, the
    attention implementation, …; ``select`` refuses a fact its op's record, ``op_specs.OP_SPECS``, does not list)."""

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
    key: Key  # the implementation's name within its op
    label: str  # what doctor prints
    family: Family
    priority: int  # lower first
    requires: str | None = None  # the pip distribution it needs
    needs: Callable[[Stack], str | None] = _always  # why this machine cannot run it (None: it can)
    fits: Callable[[Call], str | None] = _always  # why it does not take this call
    auto: Callable[[Call], str | None] = _always  # why the automatic rule passes it over for this call
    because: Callable[[Stack], str] = lambda stack: ""  # why it runs, when it is the first choice
    missing_warning: str | None = None  # warn (this key, once) when only its absence passes it over
    when: str = ""  # when the automatic rule runs it, in words (docs/gpu.md's kernel table)
    # False: its op's module binds no function for it, the caller does the work itself (the dense attention mask:
    # the model's own attention function with a [B, 1, T, T] mask).
    has_function: bool = True
    # Attention: it takes the samples' borders (``cu_seq_lens_q/k``) instead of a mask ...
    reads_borders: bool = False
    # ... even when the caller hands a 4-D mask of its own (FlashAttention's varlen call takes no mask).
    ignores_masks: bool = False

    @property
    def needs_mask(self) -> bool:
        """Attention: the caller builds a dense block-causal ``T x T`` mask for packed rows (memory grows as T²)."""
        return self.op == Op.ATTENTION and not self.reads_borders


def implementations(op: Op) -> tuple[Key, ...]:
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
    return Kernel(op, Key(family.value), label, family, 0, requires=requires, auto=_gpu_call, **more)


def _fla(op: Op, label: str) -> Kernel:
    return _triton(op, Family.FLA, label, "fla-core", because=_fla_because, missing_warning=FLA_MISSING)


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


def _cpp(op: Op, key: Key, label: str, priority: int, fits: Callable[[Call], str | None], **more) -> Kernel:
    """An entry of the package's C++ CPU extension (``ops/cpu/``): built on first use with the
    machine's compiler; a build that fails passes it over (``KernelLoadError``) with one warning."""
    return Kernel(
        op,
        key,
        label,
        Family.CPP,
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


def _liger(op: Op, label: str) -> Kernel:
    return _triton(
        op,
        Family.LIGER,
        label,
        "liger-kernel",
        fits=lambda call: _fused(True)(call) or _triton_fits(call),
        because=lambda stack: f"liger-kernel {stack.version('liger-kernel')}",
        when="GPU",
    )


KERNELS: tuple[Kernel, ...] = (
    # Training / prefill: the chunked gated delta rule (ops/gated_delta_rule/dispatch.py binds the functions).
    _fla(Op.GDN_CHUNK, "fla chunk_gated_delta_rule"),
    Kernel(Op.GDN_CHUNK, Key.TORCH_PARALLEL_COMPILED, "PyTorch chunked GDN (parallel-compiled)", Family.TORCH, 1,
           auto=lambda call: "opt-in (compiling costs tens of seconds per process)", when="opt-in"),
    Kernel(Op.GDN_CHUNK, Key.TORCH_PARALLEL, "PyTorch chunked GDN (parallel)", Family.TORCH, 2, auto=_gpu_call,
           when="GPU tensors"),
    Kernel(Op.GDN_CHUNK, Key.TORCH_CHUNK, "PyTorch chunked GDN (chunk)", Family.TORCH, 3),
    # Decoding a few tokens (HF generate): the token-by-token rule (dispatch.py).
    _fla(Op.GDN_RECURRENT, "fla fused_recurrent_gated_delta_rule"),
    Kernel(Op.GDN_RECURRENT, Key.TORCH, "PyTorch recurrent GDN", Family.TORCH, 1),
    # GDN's short convolution, whole sequences and decode steps (ops/causal_conv1d.py).
    _fla(Op.CONV, "fla causal_conv1d"),
    Kernel(Op.CONV, Key.TORCH, "PyTorch causal conv", Family.TORCH, 1),
    # Serving (vLLM) prompt chunks on state slots (ops/gated_delta_rule/in_slots.py, chunk_prefill.py): bf16 GEMM
    # operands for bf16 inputs on a CPU with bf16 dot products, as fla feeds its dot products on a GPU.
    _fla(Op.GDN_PREFILL_IN_SLOTS, "fla chunk_gated_delta_rule on gathered slots"),
    _cpp(Op.GDN_PREFILL_IN_SLOTS, Key.CPP_BF16_GEMM,
         "C++ prefill on the slots (cpu_prefill.cpp), bf16 GEMM operands", 1,
         lambda call: _cpu_prefill_fits(call) or _bf16_gemm_fits(call),
         needs=lambda stack: _linux_compiler(stack) or _bf16_dot_products(stack),
         because=lambda stack: f"bf16 inputs on a CPU with bf16 dot products, built with {stack.compiler}",
         when="bf16 inputs, fp32 state, a CPU with bf16 dot products, Linux, a C++ compiler"),
    _cpp(Op.GDN_PREFILL_IN_SLOTS, Key.CPP, "C++ prefill on the slots (cpu_prefill.cpp)", 2, _cpu_prefill_fits,
         when="bf16 or fp32 inputs, fp32 state"),
    Kernel(Op.GDN_PREFILL_IN_SLOTS, Key.TORCH_BF16_GEMM, "PyTorch prefill on the slots, bf16 GEMM operands",
           Family.TORCH, 3, needs=_bf16_dot_products, fits=_bf16_gemm_fits,
           because=lambda stack: "bf16 inputs on a CPU with bf16 dot products",
           when="bf16 inputs, a CPU with bf16 dot products"),
    Kernel(Op.GDN_PREFILL_IN_SLOTS, Key.TORCH, "PyTorch prefill on the slots (chunk_prefill.py)", Family.TORCH, 4),
    # Serving decode tokens on state slots (in_slots.py; the C++ step is ops/cpu/cpu_step.py's).
    _fla(Op.GDN_DECODE_STEP, "fla fused_recurrent_gated_delta_rule on gathered slots"),
    _cpp(Op.GDN_DECODE_STEP, Key.CPP, "C++ decode step in place (cpu_step.cpp)", 1, _cpu_step_fits,
         when="bf16 or fp32 inputs, fp32 or bf16 state, Linux, a C++ compiler"),
    Kernel(Op.GDN_DECODE_STEP, Key.TORCH, "PyTorch decode step in place", Family.TORCH, 2),
    # Serving's conv on state slots (serving/vllm/gdn.py binds them): vLLM's C++ conv, else this package's conv op.
    Kernel(Op.CONV_IN_SLOTS, Key.VLLM_CPP, "vLLM's C++ causal conv (causal_conv1d_*_cpu)", Family.VLLM, 0,
           requires="vllm", needs=_vllm_conv_needs, fits=_vllm_conv_fits,
           because=lambda stack: f"vllm {stack.version('vllm')} on a CPU with bf16 dot products, bf16 inputs, "
                                 "width 4",
           when="vLLM's CPU platform, bf16, width 4, bf16 dot products"),
    Kernel(Op.CONV_IN_SLOTS, Key.CONV_OP, "the conv op on the slots (fla on GPUs, PyTorch elsewhere)", Family.TORCH,
           1),
    # Serving's absorbed decode over the latent MLA cache (ops/latent_attention binds them, latent_mla.py runs them).
    _triton(Op.LATENT_DECODE, Family.TRITON, "Triton split-K latent decode (ops/latent_attention/triton_decode.py)",
            "triton"),
    Kernel(Op.LATENT_DECODE, Key.TORCH, "PyTorch latent decode (ops/latent_attention/cpu_decode.py)", Family.TORCH, 1),
    # The gated RMSNorm closing a GDN layer (ops/gated_rms_norm.py; the vLLM layer on a GPU runs vLLM's own).
    _cpp(Op.GATED_NORM, Key.CPP, "C++ one-pass gated RMSNorm (gated_rms_norm.cpp)", 0,
         lambda call: _cpu_inference(call) or (None if call.fact(Fact.SAME_GATE) else "a gate of another dtype"),
         when="CPU, bf16 or fp32, no gradient"),
    Kernel(Op.GATED_NORM, Key.TORCH, "PyTorch gated RMSNorm", Family.TORCH, 1),
    # MLA over packed rows (layers/mla.py), named as attention_policy.py names them; the dense mask is the model's
    # own attention function with a [B, 1, T, T] mask (no function of its own).
    Kernel(Op.ATTENTION, Key.FLASH_VARLEN, "FlashAttention varlen", Family.FLASH_ATTN, 0,
           fits=_attention(*FLASH_ATTENTION_BACKENDS), when="`flash_attention_2/3`", reads_borders=True,
           ignores_masks=True),
    Kernel(Op.ATTENTION, Key.FLEX_BLOCK_MASK, "flex_attention on the samples' borders", Family.FLEX, 1,
           fits=_attention(SDPA), auto=_gpu_call, when="sdpa, GPU tensors", reads_borders=True),
    Kernel(Op.ATTENTION, Key.SDPA_PER_SEGMENT, "one sdpa call per sample", Family.SDPA, 2, fits=_attention(SDPA),
           when="sdpa", reads_borders=True),
    Kernel(Op.ATTENTION, Key.DENSE_MASK, "a dense block-causal mask", Family.DENSE, 3, has_function=False),
    # The training loss from hidden states (loss.py); ``fused`` is LLaMA-Factory's enable_liger_kernel.
    _liger(Op.LOSS, "Liger fused linear CE"),
    Kernel(Op.LOSS, Key.CHUNKED, "chunked PyTorch CE", Family.CHUNKED, 1, fits=_fused(True)),
    Kernel(Op.LOSS, Key.LOGITS, "full-logit cross-entropy", Family.LOGITS, 2, fits=_fused(False),
           when="`enable_liger_kernel: false`"),
    # Logit distillation (distill/kd_loss.py).
    _liger(Op.DISTILLATION_LOSS, "Liger fused linear JSD"),
    Kernel(Op.DISTILLATION_LOSS, Key.CHUNKED, "chunked PyTorch KL", Family.CHUNKED, 1),
)  # fmt: skip

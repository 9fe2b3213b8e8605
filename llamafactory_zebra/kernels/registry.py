"""The kernel registry: one entry per op × implementation, and the one function that picks among them.

Modelled on fla's ``fla/backends``: each :class:`Kernel` names its op, its implementation's key and
family, a priority (lower first), the distribution it needs, and three predicates — whether the machine
can run it (:attr:`Kernel.needs`, on the probed :class:`~.stack.Stack`), whether it takes this call at all
(:attr:`Kernel.fits`: device type, dtype, shapes of the inputs, as a :class:`Call`) and whether the
automatic rule picks it for this call (:attr:`Kernel.auto`, e.g. the GPU-shaped PyTorch GDN only for
GPU tensors). The switches (``switches.py``) leave entries out or force them.

:func:`select` is the one decider: the ops call it at each call with a :class:`Call` built from their
inputs, and ``resolve()`` (``llamafactory-zebra doctor``, the training preflight, the inference entry
points) calls it with the call a run of the recipe makes on that machine. A call's facts are all an
entry reads, so a faked CUDA or ROCm stack is decided on a CPU machine exactly as on the GPU
(``tests/kernels/test_kernel_matrix.py``). The ops map each key to their function (``IMPLEMENTATIONS`` tables
next to the op); a test checks those tables name exactly this registry's entries.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from ..attention_policy import FLASH_ATTENTION_BACKENDS, SDPA
from ..kernel_names import Fact, Family, Key, Op
from .stack import Stack, detect_stack
from .switches import SWITCHES, TRITON_INTERPRET_ENV_VAR, Switch, triton_interpreter_enabled

logger = logging.getLogger(__name__)

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
    key: Key  # the implementation's name within its op (the op's implementation table is keyed by it)
    label: str  # what doctor prints
    family: Family
    priority: int  # lower first
    requires: str | None = None  # the pip distribution it needs
    needs: Callable[[Stack], str | None] = _always  # why this machine cannot run it (None: it can)
    fits: Callable[[Call], str | None] = _always  # why it does not take this call
    auto: Callable[[Call], str | None] = _always  # why the automatic rule passes it over for this call
    because: Callable[[Stack], str] = lambda stack: ""  # why it runs, when it is the first choice
    missing_warning: str | None = None  # warn (this key, once) when only its absence passes it over


@dataclass(frozen=True)
class Selection:
    kernel: Kernel
    reason: str
    passed_over: tuple[tuple[Kernel, str], ...] = ()  # higher-priority entries and why each was passed over
    missing: Kernel | None = None  # an entry the call would have run but for its absence (see Kernel.missing_warning)


class KernelUnavailable(RuntimeError):
    """A switch (or a caller) demands a kernel that cannot run here; the message names the demand and why."""

    def __init__(self, message: str, demanded: tuple[Kernel, ...] = (), setting: str = "", fix: str = "") -> None:
        super().__init__(message + (f"; {fix}" if fix else ""))
        self.demanded, self.setting, self.fix = demanded, setting, fix


class KernelLoadError(RuntimeError):
    """Raised by an op's adapter when the implementation's package is installed but does not load here."""


# Entries that were found not to import in this process (``report_unusable``): (op, key) → why.
_unusable: dict[tuple[str, str], str] = {}


def report_unusable(op: str, key: str, why: str) -> None:
    """The entry's package is installed but does not load here: pass it over from now on, in this process
    (the op's call and ``resolve()`` then agree)."""
    _unusable[(op, key)] = why
    _select.cache_clear()


def _machine_reason(kernel: Kernel, stack: Stack) -> str | None:
    if kernel.requires and stack.version(kernel.requires) is None:
        return f"{kernel.requires} is not installed"
    if (kernel.op, kernel.key) in _unusable:
        return f"{kernel.requires or kernel.key} does not load here ({_unusable[(kernel.op, kernel.key)]})"
    return kernel.needs(stack)


def select(op: str, call: Call, stack: Stack | None = None, force: str | None = None) -> Selection:
    """The kernel ``op`` runs for ``call`` on ``stack`` (default: :func:`~.stack.detect_stack`).

    ``force`` is a key the caller demands (a model's ``enable_fused_cross_entropy("liger")``), strict like
    ``ZEBRA_GDN_BACKEND=fla``. Raises :class:`KernelUnavailable` when a strict demand cannot be met.
    """
    stack = detect_stack() if stack is None else stack
    values = tuple(switch.value() if op in switch.ops else None for switch in SWITCHES)
    return _select(op, call, stack, force, values, triton_interpreter_enabled())


@functools.lru_cache(maxsize=4096)
def _select(
    op: str, call: Call, stack: Stack, force: str | None, values: tuple[str | None, ...], interpreter: bool
) -> Selection:
    """:func:`select` for one set of switch values (and Triton interpreter flag, which the entries read)."""
    entries = sorted((k for k in KERNELS if k.op == op), key=lambda k: k.priority)
    if not entries:
        raise KeyError(f"no kernel registered for op {op!r}; ops: {', '.join(OPS)}")
    unknown = sorted(set(call.facts) - FACTS[op])
    if unknown:
        declared = ", ".join(sorted(FACTS[op])) or "none"
        raise ValueError(f"{op}: a call with unknown fact(s) {', '.join(unknown)} (its entries read: {declared})")
    if force is not None and force not in {k.key for k in entries}:
        raise ValueError(f"{op}: {force!r} is not one of {', '.join(k.key for k in entries)}")
    facts = call.facts
    forced: set[str] = set()
    strict: list[tuple[str, str]] = []  # (setting, fix)
    left_out: dict[str, str] = {}
    for switch, value in zip(SWITCHES, values, strict=True):
        if value is None or not switch.applies(facts):
            continue
        setting = switch.values[value]
        for kernel in entries:
            if not _governed(switch, kernel) or setting.allows is None:
                continue
            named = kernel.key in setting.allows or kernel.family in setting.allows
            if not named:
                left_out[kernel.key] = f"{switch.env_var}={value}"
            elif setting.forces:
                forced.add(kernel.key)
        if setting.strict:
            strict.append((f"{switch.env_var}={value}", switch.fix))
    if force is not None:
        forced, strict = {force}, [(f"{op}: {force} demanded", "")]
        left_out = {k.key: strict[0][0] for k in entries if k.key != force}

    passed_over: list[tuple[Kernel, str]] = []
    missing = None
    for kernel in entries:
        why = left_out.get(kernel.key)
        if why is None:
            machine = _machine_reason(kernel, stack)
            fit = kernel.fits(call)
            why = machine or fit or (None if kernel.key in forced else kernel.auto(call))
            if machine and not fit and missing is None and kernel.missing_warning and kernel.auto(call) is None:
                missing = kernel
        if why is None:
            reason = _reason(kernel, stack, passed_over, forced, strict)
            return Selection(kernel, reason, tuple(passed_over), missing)
        passed_over.append((kernel, why))
    if strict:
        setting, fix = strict[0]
        demanded = tuple(k for k, _ in passed_over if k.key in forced)
        reasons = "; ".join(why for k, why in passed_over if k.key in forced)
        raise KernelUnavailable(f"{setting} but {op} cannot run it {_where(call)}: {reasons}", demanded, setting, fix)
    raise KernelUnavailable(
        f"{op}: no kernel takes {_where(call)}: " + "; ".join(f"{k.key}: {w}" for k, w in passed_over)
    )


def _governed(switch: Switch, kernel: Kernel) -> bool:
    return kernel.op in switch.ops and (kernel.key in switch.governs or kernel.family in switch.governs)


def _where(call: Call) -> str:
    return f"on {call.device_type} inputs" + (f" ({call.dtype})" if call.dtype is not None else "")


def _reason(
    kernel: Kernel,
    stack: Stack,
    passed_over: list[tuple[Kernel, str]],
    forced: set[str],
    strict: list[tuple[str, str]],
) -> str:
    """Why this entry runs: the switch that forced it, else its own reason, else what passed the first choice over."""
    own = kernel.because(stack)
    if kernel.key in forced:
        setting = strict[0][0] if strict else next(iter(_forcing_switches(kernel)), "forced")
        return f"{setting}: {own}" if own else setting
    return own or (passed_over[0][1] if passed_over else "")


def _forcing_switches(kernel: Kernel) -> list[str]:
    return [
        f"{switch.env_var}={switch.value()}"
        for switch in SWITCHES
        if _governed(switch, kernel) and switch.values[switch.value()].forces
    ]


def run(op: str, call: Call, implementations: Mapping[str, Callable], *args, force: str | None = None, **kwargs):
    """Run ``op``'s kernel for ``call``: :func:`select`, then the op's function for the chosen key.

    An entry passed over only because its package is missing warns once (fla on a GPU); an adapter that
    finds its package installed but not loading raises :class:`KernelLoadError`, and the next entry runs
    (the entry stays passed over in this process, so ``resolve()`` says the same from then on).
    """
    while True:
        selection = select(op, call, force=force)
        if selection.missing is not None:
            emit_once(selection.missing.missing_warning, missing_message(selection.missing), logger.warning)
        try:
            return implementations[selection.kernel.key](*args, **kwargs)
        except KernelLoadError as error:
            report_unusable(op, selection.kernel.key, str(error))


def packed_attention_kernel(attn_implementation: str | None, device_type: str) -> str:
    """What MLA attention runs on for packed rows (``attention_policy`` names the kernels), for the model's
    ``attn_implementation`` and the device type of its tensors (``"cuda"`` also on ROCm).

    >>> packed_attention_kernel("flash_attention_2", "cuda"), packed_attention_kernel("eager", "cpu")
    ('flash_varlen', 'dense_mask')
    >>> packed_attention_kernel("sdpa", "cuda"), packed_attention_kernel("sdpa", "cpu")
    ('flex_block_mask', 'sdpa_per_segment')
    """
    return select(ATTENTION, Call.on(device_type, attn_implementation=attn_implementation)).kernel.key


def fla_missing_message() -> str:
    return (
        f"fla (pip fla-core) is missing or does not import on this GPU machine: the GDN layers run the PyTorch "
        f"path ({TORCH_GDN_GPU_COST}); install it: {FLA_INSTALL}"
    )


def missing_message(kernel: Kernel) -> str:
    """The warning for an entry passed over only because its package is missing (one kind so far: fla)."""
    return {FLA_MISSING: fla_missing_message}[kernel.missing_warning]()


_emitted: set[str] = set()


def emit_once(key: str, message: str, emit: Callable[[str], None]) -> bool:
    """Emit ``message`` the first time ``key`` is seen in this process (entry points and ops share it)."""
    if key in _emitted:
        return False
    _emitted.add(key)
    emit(message)
    return True


def implementations(op: str) -> tuple[str, ...]:
    """The keys of ``op``'s entries, by priority (what its IMPLEMENTATIONS table must map)."""
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


def _triton(op: Op, family: Family, label: str, requires: str, **predicates) -> Kernel:
    """A Triton entry (fla's, Liger's): first choice for GPU tensors; CPU ones only when demanded, under
    Triton's interpreter."""
    predicates = {"needs": _triton_needs, "fits": _triton_fits} | predicates
    return Kernel(op, Key(family.value), label, family, 0, requires=requires, auto=_gpu_call, **predicates)


def _fla(op: Op, label: str) -> Kernel:
    return _triton(op, FLA, label, "fla-core", because=_fla_because, missing_warning=FLA_MISSING)


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
    """An entry of the package's C++ CPU extension (``ops/cpu_extension.py``): built on first use with the
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


def _liger(op: Op, label: str) -> Kernel:
    return _triton(
        op,
        Family.LIGER,
        label,
        "liger-kernel",
        fits=lambda call: _fused(True)(call) or _triton_fits(call),
        because=lambda stack: f"liger-kernel {stack.version('liger-kernel')}",
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

KERNELS: tuple[Kernel, ...] = (
    # Training / prefill: the chunked gated delta rule (ops/gated_delta_rule/dispatch.py).
    _fla(GDN_CHUNK, "fla chunk_gated_delta_rule"),
    Kernel(GDN_CHUNK, Key.TORCH_PARALLEL_COMPILED, "PyTorch chunked GDN (parallel-compiled)", TORCH, 1,
           auto=lambda call: "opt-in (compiling costs tens of seconds per process)"),
    Kernel(GDN_CHUNK, Key.TORCH_PARALLEL, "PyTorch chunked GDN (parallel)", TORCH, 2, auto=_gpu_call),
    Kernel(GDN_CHUNK, Key.TORCH_CHUNK, "PyTorch chunked GDN (chunk)", TORCH, 3),
    # Decoding a few tokens (HF generate): the token-by-token rule.
    _fla(GDN_RECURRENT, "fla fused_recurrent_gated_delta_rule"),
    Kernel(GDN_RECURRENT, Key.TORCH, "PyTorch recurrent GDN", TORCH, 1),
    # GDN's short convolution, whole sequences and decode steps (ops/causal_conv1d.py).
    _fla(CONV, "fla causal_conv1d"),
    Kernel(CONV, Key.TORCH, "PyTorch causal conv", TORCH, 1),
    # Serving (vLLM) prompt chunks on state slots (ops/gated_delta_rule/in_slots.py, chunk_prefill.py): bf16 GEMM
    # operands for bf16 inputs on a CPU with bf16 dot products, as fla feeds its dot products on a GPU.
    _fla(GDN_PREFILL_IN_SLOTS, "fla chunk_gated_delta_rule on gathered slots"),
    _cpp(GDN_PREFILL_IN_SLOTS, Key.CPP_BF16_GEMM, "C++ prefill on the slots (cpu_prefill.cpp), bf16 GEMM operands", 1,
         lambda call: _cpu_prefill_fits(call) or _bf16_gemm_fits(call),
         needs=lambda stack: _linux_compiler(stack) or _bf16_dot_products(stack),
         because=lambda stack: f"bf16 inputs on a CPU with bf16 dot products, built with {stack.compiler}"),
    _cpp(GDN_PREFILL_IN_SLOTS, Key.CPP, "C++ prefill on the slots (cpu_prefill.cpp)", 2, _cpu_prefill_fits),
    Kernel(GDN_PREFILL_IN_SLOTS, Key.TORCH_BF16_GEMM, "PyTorch prefill on the slots, bf16 GEMM operands", TORCH, 3,
           needs=_bf16_dot_products, fits=_bf16_gemm_fits,
           because=lambda stack: "bf16 inputs on a CPU with bf16 dot products"),
    Kernel(GDN_PREFILL_IN_SLOTS, Key.TORCH, "PyTorch prefill on the slots (chunk_prefill.py)", TORCH, 4),
    # Serving decode tokens on state slots.
    _fla(GDN_DECODE_STEP, "fla fused_recurrent_gated_delta_rule on gathered slots"),
    _cpp(GDN_DECODE_STEP, Key.CPP, "C++ decode step in place (cpu_step.cpp)", 1, _cpu_step_fits),
    Kernel(GDN_DECODE_STEP, Key.TORCH, "PyTorch decode step in place", TORCH, 2),
    # Serving's conv on state slots (serving/vllm/gdn.py): vLLM's C++ conv, else this package's conv op.
    Kernel(CONV_IN_SLOTS, Key.VLLM_CPP, "vLLM's C++ causal conv (causal_conv1d_*_cpu)", VLLM, 0,
           requires="vllm", needs=_vllm_conv_needs, fits=_vllm_conv_fits,
           because=lambda stack: f"vllm {stack.version('vllm')} on a CPU with bf16 dot products, bf16 inputs, "
                                 "width 4"),
    Kernel(CONV_IN_SLOTS, Key.CONV_OP, "the conv op on the slots (fla on GPUs, PyTorch elsewhere)", TORCH, 1),
    # The gated RMSNorm closing a GDN layer (ops/gated_rms_norm.py; the vLLM layer on a GPU runs vLLM's own).
    _cpp(GATED_NORM, Key.CPP, "C++ one-pass gated RMSNorm (gated_rms_norm.cpp)", 0,
         lambda call: _cpu_inference(call) or (None if call.fact(Fact.SAME_GATE) else "a gate of another dtype")),
    Kernel(GATED_NORM, Key.TORCH, "PyTorch gated RMSNorm", TORCH, 1),
    # MLA over packed rows (layers/mla.py), named as attention_policy.py names them.
    Kernel(ATTENTION, Key.FLASH_VARLEN, "FlashAttention varlen", FLASH_ATTN, 0,
           fits=_attention(*FLASH_ATTENTION_BACKENDS)),
    Kernel(ATTENTION, Key.FLEX_BLOCK_MASK, "flex_attention on the samples' borders", Family.FLEX, 1,
           fits=_attention(SDPA), auto=_gpu_call),
    Kernel(ATTENTION, Key.SDPA_PER_SEGMENT, "one sdpa call per sample", Family.SDPA, 2, fits=_attention(SDPA)),
    Kernel(ATTENTION, Key.DENSE_MASK, "a dense block-causal mask", Family.DENSE, 3),
    # The training loss from hidden states (loss.py); ``fused`` is LLaMA-Factory's enable_liger_kernel.
    _liger(LOSS, "Liger fused linear CE"),
    Kernel(LOSS, Key.CHUNKED, "chunked PyTorch CE", Family.CHUNKED, 1, fits=_fused(True)),
    Kernel(LOSS, Key.LOGITS, "full-logit cross-entropy", Family.LOGITS, 2, fits=_fused(False)),
    # Logit distillation (distill/kd_loss.py).
    _liger(DISTILLATION_LOSS, "Liger fused linear JSD"),
    Kernel(DISTILLATION_LOSS, Key.CHUNKED, "chunked PyTorch KL", Family.CHUNKED, 1),
)  # fmt: skip

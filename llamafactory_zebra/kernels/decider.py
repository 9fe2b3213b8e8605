"""The kernel registry's one decider: :func:`select` chooses an entry of ``registry.py``'s table for a call, and
:func:`run` runs the function its op's module bound for that entry (``bindings.py``).

The ops call :func:`run` at each call with a :class:`~.registry.Call` built from their inputs, and ``resolve()``
(``llamafactory-zebra doctor``, the training preflight, the inference entry points) calls :func:`select` with the
call a run of the recipe makes on that machine, so both answer the same. The switches (``switches.py``) leave
entries out or force them. The table (``registry.py``) holds the entries and their rules, the ops' modules their
functions; this module holds no entry of its own, so adding one is a row and its function.

A caller whose call's facts are fixed once (a vLLM layer: its dtype, state layout and platform are known at init)
chooses once with :func:`fixed_call`, as vLLM's own layers bind their kernels when they are built.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from ..kernel_names import EntryPoint, Key, Op
from .bindings import bound_function
from .op_specs import OP_SPECS, OPS
from .registry import FLA_INSTALL, FLA_MISSING, KERNELS, TORCH_GDN_GPU_COST, Call, Kernel, triton_interpreter_enabled
from .stack import Stack, detect_stack
from .switches import SWITCHES, Switch

logger = logging.getLogger(__name__)


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


def select(op: Op, call: Call, stack: Stack | None = None, force: Key | None = None) -> Selection:
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
    facts_read = OP_SPECS[op].facts
    unknown = sorted(set(call.facts) - facts_read)
    if unknown:
        declared = ", ".join(sorted(facts_read)) or "none"
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


def run(op: Op, call: Call, *args, force: Key | None = None, entry_point: EntryPoint = EntryPoint.RUN, **kwargs):
    """Run ``op``'s kernel for ``call``: :func:`select`, then the chosen entry's function (its ``entry_point``:
    ``conv`` has one for whole sequences and one for decode steps).

    An entry passed over only because its package is missing warns once (fla on a GPU); an adapter that
    finds its package installed but not loading raises :class:`KernelLoadError`, and the next entry runs
    (the entry stays passed over in this process, so ``resolve()`` says the same from then on).
    """
    while True:
        selection = select(op, call, force=force)
        if selection.missing is not None:
            emit_once(selection.missing.missing_warning, missing_message(selection.missing), logger.warning)
        try:
            return implementation(selection.kernel, entry_point)(*args, **kwargs)
        except KernelLoadError as error:
            report_unusable(op, selection.kernel.key, str(error))


class FixedCall:
    """An op chosen once for a call whose facts do not change (a vLLM layer's, known when it is built): calling it
    runs the chosen entry's function, as :func:`run` would, without deciding again. An entry whose package turns out
    not to load (:class:`KernelLoadError`) is passed over and the op chosen again, as :func:`run` does."""

    def __init__(self, op: Op, call: Call) -> None:
        self.op, self.call = op, call
        self.selection = select(op, call)

    @property
    def kernel(self) -> Kernel:
        return self.selection.kernel

    def __call__(self, *args, entry_point: EntryPoint = EntryPoint.RUN, **kwargs):
        while True:
            try:
                return implementation(self.kernel, entry_point)(*args, **kwargs)
            except KernelLoadError as error:
                report_unusable(self.op, self.kernel.key, str(error))
                self.selection = select(self.op, self.call)


def fixed_call(op: Op, call: Call) -> FixedCall:
    """``op`` chosen once for ``call`` (:class:`FixedCall`); the missing-package warning, if any, now."""
    fixed = FixedCall(op, call)
    if fixed.selection.missing is not None:
        emit_once(fixed.selection.missing.missing_warning, missing_message(fixed.selection.missing), logger.warning)
    return fixed


def packed_attention(attn_implementation: str | None, device_type: str) -> Kernel:
    """The entry MLA attention runs for packed rows (``attention_policy`` names the implementations), for the
    model's ``attn_implementation`` and the device type of its tensors (``"cuda"`` also on ROCm); its properties
    say what the caller hands it (:attr:`Kernel.reads_borders`, :attr:`Kernel.needs_mask`, ...).

    >>> packed_attention("flash_attention_2", "cuda").key, packed_attention("eager", "cpu").key
    ('flash_varlen', 'dense_mask')
    >>> packed_attention("sdpa", "cuda").key, packed_attention("sdpa", "cpu").key
    ('flex_block_mask', 'sdpa_per_segment')
    >>> packed_attention("sdpa", "cpu").reads_borders, packed_attention("eager", "cpu").needs_mask
    (True, True)
    """
    return select(Op.ATTENTION, Call.on(device_type, attn_implementation=attn_implementation)).kernel


def packed_attention_function(attn_implementation: str | None, device_type: str) -> Callable | None:
    """The function of :func:`packed_attention`'s entry; ``None`` for the dense mask, which runs the model's own
    attention function."""
    kernel = packed_attention(attn_implementation, device_type)
    return implementation(kernel) if kernel.has_function else None


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


def implementation(kernel: Kernel, entry_point: EntryPoint = EntryPoint.RUN) -> Callable:
    """The function bound for ``kernel`` at ``entry_point``, looked up at each call (the tests spy on it)."""
    return bound_function(kernel, entry_point)

"""Which kernel each part of a Zebra run uses on a given machine, why, and what must stop the run.

The one place that decides, from a :class:`~.stack.Stack` and whether the run needs a backward pass,
between fla's Triton kernels and the PyTorch path for the GDN layers (chunked prefill/training,
recurrent decode, short conv), which attention kernel MLA gets and which loss the run computes —
and which known-broken combinations (``known_issues.py``) apply. ``llamafactory-cli train`` resolves
before the model loads and stops on a blocking problem; inference entry points log the table;
``llamafactory-zebra doctor`` prints it for both phases. The ops themselves (``ops/backend.py``) read
the same backend switch from here and still dispatch on each tensor's device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ..attention_policy import FLASH_ATTENTION_2, SDPA, packed_attention_kernel
from .known_issues import KNOWN_ISSUES, TORCH_GDN_MEASURED_COST, KnownIssue
from .stack import Stack
from .switches import (
    BACKEND_ENV_VAR,
    TRITON_INTERPRET_ENV_VAR,
    requested_backend,
    torch_chunk_choice,
    triton_interpreter_enabled,
)

PARTS = ("GDN chunk", "GDN recurrent", "conv", "attention", "loss")
TRAINING, INFERENCE = "training", "inference"
FLA_MISSING = "fla-missing-on-gpu"
STOP, WARN, NOTE = "stop", "warn", "note"

FLA_INSTALL = "pip install fla-core  (the plugin's `gpu` extra pins the tested range)"


@dataclass(frozen=True)
class Choice:
    part: str
    kernel: str
    family: str  # "fla", "torch", "flash-attn", "sdpa", "eager", "liger", "chunked", "logits"
    reason: str


@dataclass(frozen=True)
class Problem:
    part: str
    severity: str  # STOP (training must not start), WARN or NOTE
    message: str
    fixes: tuple[str, ...] = ()
    key: str | None = None  # for :func:`emit_once`; a ``known_issues`` key when it comes from one


@dataclass(frozen=True)
class Resolution:
    phase: str
    stack: Stack
    choices: tuple[Choice, ...]
    problems: tuple[Problem, ...] = field(default=())

    def choice(self, part: str) -> Choice:
        return next(c for c in self.choices if c.part == part)

    def with_severity(self, severity: str) -> list[Problem]:
        return [p for p in self.problems if p.severity == severity]

    def table(self, fixes: bool = True) -> str:
        width = max(len(c.part) for c in self.choices)
        kernel_width = max(len(c.kernel) for c in self.choices)
        lines = [f"kernels for {self.phase} on {self.stack.describe()}:"]
        lines += [f"  {c.part:<{width}}  {c.kernel:<{kernel_width}}  {c.reason}" for c in self.choices]
        for problem in self.problems:
            lines.append(f"  {problem.severity.upper()}: {problem.message}")
            lines += [f"    fix: {fix}" for fix in problem.fixes if fixes]
        return "\n".join(lines)

    def stop_message(self) -> str:
        """The error that ends a blocked run: what is wrong, then the fixes as its last lines."""
        blocking = self.with_severity(STOP)
        lines = [f"llamafactory-zebra stopped the {self.phase} run before loading the model:"]
        for problem in blocking:
            lines.append(f"{problem.part}: {problem.message}")
        lines.append("Fix one of:")
        fixes = [fix for problem in blocking for fix in problem.fixes]
        lines += [f"  {number}. {fix}" for number, fix in enumerate(fixes, 1)]
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {
            "phase": self.phase,
            "device": self.stack.describe(),
            "kernels": [asdict(c) for c in self.choices],
            "problems": [asdict(p) for p in self.problems],
        }


def resolve(
    stack: Stack, *, training: bool, attn_implementation: str = "sdpa", liger_enabled: bool = True
) -> Resolution:
    """Resolve every part for a training run (forward + backward) or inference (forward only).

    ``attn_implementation`` is what the run asks transformers for (``attn_implementation_for`` of
    LLaMA-Factory's ``flash_attn``); ``liger_enabled`` is ``enable_liger_kernel`` (training only).
    """
    problems: list[Problem] = []
    gdn_family, gdn_reason = _gdn_family(stack, requested_backend(), problems)
    labels = {
        "GDN chunk": ("fla chunk_gated_delta_rule", f"PyTorch chunked GDN ({torch_chunk_choice(stack.has_gpu)})"),
        "GDN recurrent": ("fla fused_recurrent_gated_delta_rule", "PyTorch recurrent GDN"),
        "conv": ("fla causal_conv1d", "PyTorch causal conv"),
    }
    choices = [
        Choice(part, fla if gdn_family == "fla" else torch, gdn_family, gdn_reason)
        for part, (fla, torch) in labels.items()
    ]
    choices.append(attention_choice(stack, attn_implementation))
    if training:
        choices.append(loss_choice(stack, liger_enabled))
    phases = ("forward", "backward") if training else ("forward",)
    for issue in KNOWN_ISSUES:
        problems += _issue_problems(issue, stack, choices, phases, training)
    return Resolution(TRAINING if training else INFERENCE, stack, tuple(choices), tuple(problems))


def _gdn_family(stack: Stack, backend: str, problems: list[Problem]) -> tuple[str, str]:
    """fla or the PyTorch path for the GDN layers (chunk, recurrent and conv dispatch alike, ``ops/backend.py``)."""
    if backend == "torch":
        return "torch", f"{BACKEND_ENV_VAR}=torch"
    fla, triton = stack.version("fla-core"), stack.version("triton")
    installed = f"fla-core {fla}" + (f", triton {triton}" if triton else "")
    if fla and stack.has_gpu:
        return "fla", f"{installed} on {stack.device.upper()}"
    if fla and backend == "fla" and triton_interpreter_enabled():
        return "fla", f"{installed} under Triton's CPU interpreter ({TRITON_INTERPRET_ENV_VAR}=1)"
    if backend == "fla":
        where = "fla-core is not installed" if not fla else "there is no GPU"
        problems.append(
            Problem(
                "GDN chunk",
                STOP,
                f"{BACKEND_ENV_VAR}=fla but {where}: every GDN layer would fail at its first call",
                (FLA_INSTALL if not fla else "run on a CUDA or ROCm GPU", f"or set {BACKEND_ENV_VAR}=auto"),
            )
        )
        return "torch", f"{BACKEND_ENV_VAR}=fla cannot run here"
    if stack.has_gpu:
        problems.append(Problem("GDN chunk", WARN, fla_missing_message(), key=FLA_MISSING))
        return "torch", "fla-core is not installed"
    return "torch", "no GPU (fla's kernels are Triton)"


def fla_missing_message() -> str:
    return (
        f"fla (pip fla-core) is missing or does not import on this GPU machine: the GDN layers run the PyTorch "
        f"path, measured at "
        f"{TORCH_GDN_MEASURED_COST}; install it: {FLA_INSTALL}"
    )


def attention_choice(stack: Stack, attn_implementation: str) -> Choice:
    """MLA's kernel for the ``attn_implementation`` LLaMA-Factory's ``flash_attn`` gives, and what packed rows
    run on with it (the attention policy's ``packed_attention_kernel``)."""
    if attn_implementation == FLASH_ATTENTION_2:
        flash_attn = stack.version("flash-attn")
        if flash_attn and stack.has_gpu:
            return Choice(
                "attention", "FlashAttention-2 varlen", "flash-attn", f"flash_attn: fa2, flash-attn {flash_attn}"
            )
        why = "flash-attn is not installed" if not flash_attn else "no GPU"
        return _with_packed_kernel(stack, SDPA, f"flash_attn: fa2 but {why}: LLaMA-Factory falls back to sdpa")
    return _with_packed_kernel(stack, attn_implementation, f"attn_implementation {attn_implementation}")


def _with_packed_kernel(stack: Stack, attn_implementation: str, reason: str) -> Choice:
    packed = packed_attention_kernel(attn_implementation, "cuda" if stack.has_gpu else "cpu")
    return Choice("attention", f"{attn_implementation} (packed rows: {packed})", attn_implementation, reason)


def loss_choice(stack: Stack, liger_enabled: bool) -> Choice:
    if not liger_enabled:
        return Choice("loss", "full-logit cross-entropy", "logits", "enable_liger_kernel: false (transformers' loss)")
    liger = stack.version("liger-kernel")
    if liger and stack.has_gpu:
        return Choice("loss", "Liger fused linear CE", "liger", f"enable_liger_kernel, liger-kernel {liger}")
    why = "liger-kernel is not installed" if stack.has_gpu else "no GPU (Liger is Triton)"
    return Choice("loss", "chunked PyTorch CE", "chunked", f"enable_liger_kernel, {why}")


def _issue_problems(
    issue: KnownIssue, stack: Stack, choices: list[Choice], phases: tuple[str, ...], training: bool
) -> list[Problem]:
    if not any(c.part == issue.part and c.family == issue.kernel_family for c in choices):
        return []
    source = f"{issue.summary} ({', '.join(issue.upstream)})"
    if issue.matches(stack, phases):
        if issue.avoided(stack):
            return [Problem(issue.part, WARN, f"{source}; {issue.avoided_note}", key=issue.key)]
        return [Problem(issue.part, STOP if training else WARN, source, issue.fixes, issue.key)]
    if not training and issue.matches(stack, ("forward", "backward")):
        return [Problem(issue.part, NOTE, f"not affected (forward only): {source}", key=issue.key)]
    return []


_emitted: set[str] = set()


def emit_once(key: str, message: str, emit: Callable[[str], None]) -> bool:
    """Emit ``message`` the first time ``key`` is seen in this process (entry points and ops share it)."""
    if key in _emitted:
        return False
    _emitted.add(key)
    emit(message)
    return True

"""What each op of a Zebra run will call on a given machine, why, and what must stop the run.

``resolve()`` asks the registry (``decider.select``, the function the ops themselves call) with the call
a run of the recipe makes on that machine — inputs in the run's dtype (bf16, the recipe's, unless the
run names another) on its GPU (on its CPU without one), the attention implementation LLaMA-Factory gives
the model, the loss ``enable_liger_kernel`` asks for — and adds the known issues (``known_issues.py``)
that apply. ``llamafactory-cli train`` resolves before the
model loads and stops on a blocking problem; inference entry points log the table;
``llamafactory-zebra doctor`` prints it for training, inference and serving. Since the rows come from
the same function the ops call, the table is what runs (``tests/kernels/test_kernel_matrix.py`` checks it on
faked machines).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ..attention_policy import FLASH_ATTENTION_2, SDPA
from ..kernel_names import Family, Op
from .decider import KernelUnavailable, Selection, missing_message, select
from .known_issues import FORWARD, KNOWN_ISSUES, PASSES, KnownIssue
from .op_specs import INFERENCE, OP_SPECS, PHASE_OPS, SERVING, TRAINING, Recipe
from .registry import FLA_INSTALL, Call
from .stack import Stack

STOP, WARN, NOTE = "stop", "warn", "note"
# The activations a run of the recipe computes in (released checkpoints are bf16; vLLM serves them in bf16).
RUN_DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Choice:
    part: str  # the op
    kernel: str  # what it runs (the registry entry's label)
    family: str  # registry.FAMILIES
    reason: str
    key: str = ""  # the registry entry's key
    passed_over: tuple[tuple[str, str], ...] = field(default=())  # (key, why) of the entries before it


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


def run_call(
    op: Op, stack: Stack, attn_implementation: str = SDPA, liger_enabled: bool = True, dtype: torch.dtype = RUN_DTYPE
) -> Call:
    """The call a run of the recipe makes to ``op`` on ``stack``: ``dtype`` inputs on its GPU (its CPU without
    one), with the op's own facts as its record says the serving layer and the model hand them over
    (``OpSpec.recipe``)."""
    device = "cuda" if stack.has_gpu else "cpu"
    facts = OP_SPECS[op].recipe(Recipe(stack, attn_implementation, liger_enabled))
    return Call.on(device, dtype, **facts)


def resolve(
    stack: Stack,
    *,
    training: bool,
    attn_implementation: str = SDPA,
    liger_enabled: bool = True,
    serving: bool = False,
    dtype: torch.dtype = RUN_DTYPE,
) -> Resolution:
    """Resolve every op of a training run (forward + backward), inference (forward only) or vLLM serving.

    ``attn_implementation`` is what the run asks transformers for (``attn_implementation_for`` of
    LLaMA-Factory's ``flash_attn``); ``liger_enabled`` is ``enable_liger_kernel`` (training only); ``dtype``
    is what the run computes in.
    """
    phase = TRAINING if training else SERVING if serving else INFERENCE
    problems: list[Problem] = []
    choices = []
    attention_note = ""
    if attn_implementation == FLASH_ATTENTION_2 and not (stack.version("flash-attn") and stack.has_gpu):
        why = "flash-attn is not installed" if not stack.version("flash-attn") else "no GPU"
        attn_implementation, attention_note = SDPA, f"flash_attn: fa2 but {why}: LLaMA-Factory falls back to sdpa"
    for op in PHASE_OPS[phase]:
        call = run_call(op, stack, attn_implementation, liger_enabled, dtype)
        try:
            selection = select(op, call, stack)
        except KernelUnavailable as error:
            choices.append(_unavailable_choice(op, error))
            _add_once(problems, _stop_for(op, error, stack))
            continue
        if selection.missing is not None:
            missed = selection.missing
            _add_once(problems, Problem(op, WARN, missing_message(missed), key=missed.missing_warning))
        choices.append(_choice(op, selection, attn_implementation, attention_note))
    passes = PASSES if training else (FORWARD,)
    dtype_name = str(dtype).removeprefix("torch.")
    for issue in KNOWN_ISSUES:
        problems += _issue_problems(issue, stack, choices, passes, training, dtype_name)
    return Resolution(phase, stack, tuple(choices), tuple(problems))


def _choice(op: Op, selection: Selection, attn_implementation: str, attention_note: str) -> Choice:
    kernel = selection.kernel
    label, reason = kernel.label, selection.reason
    if op == Op.ATTENTION:
        if kernel.family == Family.FLASH_ATTN:
            label, reason = "FlashAttention-2 varlen", f"flash_attn: fa2, {reason}".rstrip(", ")
        else:
            label = f"{attn_implementation} (packed rows: {kernel.key})"
            reason = attention_note or f"attn_implementation {attn_implementation}"
    passed = tuple((k.key, why) for k, why in selection.passed_over)
    return Choice(op, label, kernel.family, reason, kernel.key, passed)


def _unavailable_choice(op: str, error: KernelUnavailable) -> Choice:
    demanded = error.demanded[0] if error.demanded else None
    label = demanded.label if demanded else "(none)"
    return Choice(op, label, demanded.family if demanded else "", f"{error.setting} cannot run here", "")


def _stop_for(op: str, error: KernelUnavailable, stack: Stack) -> Problem:
    """A demanded kernel that cannot run: every phase stops (the op would fail at its first call)."""
    if error.demanded and error.demanded[0].family == Family.FLA:
        where = "fla-core is not installed" if not stack.version("fla-core") else "there is no GPU"
        message = f"{error.setting} but {where}: every GDN layer would fail at its first call"
        fixes = (FLA_INSTALL if not stack.version("fla-core") else "run on a CUDA or ROCm GPU", "or set it to auto")
        return Problem(op, STOP, message, tuple(f"{fix}" for fix in fixes), key=error.setting)
    return Problem(op, STOP, str(error), (error.fix,) if error.fix else (), key=error.setting)


def _add_once(problems: list[Problem], problem: Problem) -> None:
    """One problem per key: a switch or a missing package concerns several ops at once."""
    if problem.key is None or all(p.key != problem.key for p in problems):
        problems.append(problem)


def _issue_problems(
    issue: KnownIssue, stack: Stack, choices: list[Choice], passes: tuple[str, ...], training: bool, dtype: str
) -> list[Problem]:
    if issue.kernel_family is not None and not any(
        c.part == issue.part and c.family == issue.kernel_family for c in choices
    ):
        return []
    source = f"{issue.summary} ({', '.join(issue.upstream)})" if issue.upstream else issue.summary
    if issue.matches(stack, passes, dtype):
        if issue.workaround is not None:
            return [
                Problem(
                    issue.part, NOTE, f"{source}; applied by the plugin: {issue.workaround}", issue.fixes, issue.key
                )
            ]
        if issue.avoided(stack):
            return [Problem(issue.part, WARN, f"{source}; {issue.avoided_note}", key=issue.key)]
        severity = STOP if training and not issue.only_slow else WARN
        return [Problem(issue.part, severity, source, issue.fixes, issue.key)]
    if not training and issue.workaround is None and issue.matches(stack, ("forward", "backward"), dtype):
        return [Problem(issue.part, NOTE, f"not affected (forward only): {source}", key=issue.key)]
    return []

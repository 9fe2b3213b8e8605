"""Kernel choice: which GDN, conv, attention and loss kernels each op runs, from the machine and its packages.

The lowest floor of the package above the rule modules: imports only torch, the standard library and
``importlib.metadata``, so every entry point (training, chat, doctor, the ops) can ask it before anything
heavy loads. ``stack.py`` is the one probe of the machine, ``registry.py`` the table of entries (each with its
code), ``decider.py`` the one decider (``select``) and ``run``, which the ops call, ``switches.py`` the
environment switches as data, ``resolver.py`` the
tables doctor and the entry points print from the same decider, ``known_issues.py`` the known-broken
combinations (data), ``workarounds.py`` what the plugin does about some of them itself and
``fla_seams.py`` the fla names one of those touches.
"""

from .decider import (
    KernelLoadError,
    KernelUnavailable,
    Selection,
    emit_once,
    fla_missing_message,
    packed_attention_function,
    packed_attention_kernel,
    run,
    select,
)
from .known_issues import KNOWN_ISSUES, KnownIssue, VersionRange
from .registry import (
    ATTENTION,
    BORDER_KERNELS,
    CONV,
    CONV_IN_SLOTS,
    DISTILLATION_LOSS,
    FAMILIES,
    FLA_MISSING,
    GATED_NORM,
    GDN_CHUNK,
    GDN_DECODE_STEP,
    GDN_PREFILL_IN_SLOTS,
    GDN_RECURRENT,
    KERNELS,
    LOSS,
    OPS,
    Call,
    Kernel,
    Key,
    triton_interpreter_enabled,
)
from .resolver import INFERENCE, NOTE, PHASES, SERVING, STOP, TRAINING, WARN, Choice, Problem, Resolution, resolve
from .stack import FAKE_STACK_ENV_VAR, Stack, detect_stack, parse_version, stack_from_json, this_machine
from .switches import BACKEND_ENV_VAR, SWITCHES

__all__ = [
    "ATTENTION",
    "BACKEND_ENV_VAR",
    "BORDER_KERNELS",
    "CONV",
    "CONV_IN_SLOTS",
    "DISTILLATION_LOSS",
    "FAKE_STACK_ENV_VAR",
    "FAMILIES",
    "FLA_MISSING",
    "GATED_NORM",
    "GDN_CHUNK",
    "GDN_DECODE_STEP",
    "GDN_PREFILL_IN_SLOTS",
    "GDN_RECURRENT",
    "INFERENCE",
    "KERNELS",
    "KNOWN_ISSUES",
    "LOSS",
    "NOTE",
    "OPS",
    "PHASES",
    "SERVING",
    "STOP",
    "SWITCHES",
    "TRAINING",
    "WARN",
    "Call",
    "Choice",
    "Kernel",
    "KernelLoadError",
    "KernelUnavailable",
    "Key",
    "KnownIssue",
    "Problem",
    "Resolution",
    "Selection",
    "Stack",
    "VersionRange",
    "detect_stack",
    "emit_once",
    "fla_missing_message",
    "packed_attention_function",
    "packed_attention_kernel",
    "parse_version",
    "resolve",
    "run",
    "select",
    "stack_from_json",
    "this_machine",
    "triton_interpreter_enabled",
]

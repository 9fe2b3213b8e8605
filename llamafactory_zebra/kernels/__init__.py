"""Kernel resolution: which GDN, conv, attention and loss kernels a run uses, from the machine and its packages.

The lowest floor of the package: imports only torch, the standard library and ``importlib.metadata``,
so every entry point (training, chat, doctor, the ops) can ask it before anything heavy loads.
``stack.py`` holds the facts about the machine, ``known_issues.py`` the known-broken combinations (data),
``resolver.py`` the decisions.
"""

from .known_issues import KNOWN_ISSUES, KnownIssue, VersionRange
from .resolver import (
    FLA_MISSING,
    INFERENCE,
    NOTE,
    PARTS,
    STOP,
    TRAINING,
    WARN,
    Choice,
    Problem,
    Resolution,
    emit_once,
    fla_missing_message,
    resolve,
)
from .stack import FAKE_STACK_ENV_VAR, Stack, detect_stack, parse_version, stack_from_json
from .switches import BACKEND_CHOICES, BACKEND_ENV_VAR, requested_backend, triton_interpreter_enabled

__all__ = [
    "BACKEND_CHOICES",
    "BACKEND_ENV_VAR",
    "FAKE_STACK_ENV_VAR",
    "FLA_MISSING",
    "INFERENCE",
    "KNOWN_ISSUES",
    "NOTE",
    "PARTS",
    "STOP",
    "TRAINING",
    "WARN",
    "Choice",
    "KnownIssue",
    "Problem",
    "Resolution",
    "Stack",
    "VersionRange",
    "detect_stack",
    "fla_missing_message",
    "parse_version",
    "requested_backend",
    "resolve",
    "stack_from_json",
    "triton_interpreter_enabled",
    "emit_once",
]

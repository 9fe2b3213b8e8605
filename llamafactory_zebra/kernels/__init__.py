"""Kernel choice: which GDN, conv, attention and loss kernels each op runs, from the machine and its packages.

The lowest floor of the package above the rule modules: imports only torch, the standard library,
``importlib.metadata`` and the floor below it (``kernel_names``, ``attention_policy``), so every entry point
(training, chat, doctor, the ops) can ask it before anything heavy loads. ``stack.py`` is the one probe of the
machine, ``op_specs.py`` one record per op (its facts, entry points, phases, a recipe's call, its uses),
``registry.py`` the table of entries (the rules that choose each), ``bindings.py`` the functions the ops' own
modules bind to their entries, ``decider.py`` the one decider (``select``) and ``run``, which the ops call,
``switches.py`` the environment switches as data, ``resolver.py`` the tables doctor and the entry points print
from the same decider, ``known_issues.py`` the known-broken combinations (data), ``workarounds.py`` what the plugin
does about some of them itself and ``fla_seams.py`` the fla names one of those touches.

Adding a kernel entry to an existing op (say a Triton gated RMSNorm):

1. its key in ``kernel_names.Key`` (``TRITON = "triton"``);
2. its row in ``registry.KERNELS`` — op, key, label, family, priority and the rules (``needs``, ``fits``,
   ``auto``, ``when``);
3. its function in the op's binding, in the module that runs the op
   (``bind(Op.GATED_NORM, {..., Key.TRITON: triton_gated_rms_norm})``, ``ops/gated_rms_norm.py``);
4. ``python tools/kernel_table.py --write`` (docs/gpu.md's table).

A new op adds its name to ``kernel_names.Op`` and one ``OpSpec`` to ``op_specs.OP_SPECS``, then its rows and its
binding. ``tests/kernels/test_kernel_registry.py`` checks every key has a row, every row a bound function, and that
no module outside ``kernels/`` spells a key.
"""

from ..kernel_names import EntryPoint, Fact, Family, Key, Op
from .bindings import bind
from .decider import (
    FixedCall,
    KernelLoadError,
    KernelUnavailable,
    Selection,
    emit_once,
    fixed_call,
    fla_missing_message,
    packed_attention,
    packed_attention_function,
    run,
    select,
)
from .known_issues import KNOWN_ISSUES, KnownIssue, VersionRange
from .op_specs import OP_SPECS, OPS, PHASES, OpSpec
from .registry import FLA_MISSING, KERNELS, Call, Kernel, triton_interpreter_enabled
from .resolver import INFERENCE, NOTE, SERVING, STOP, TRAINING, WARN, Choice, Problem, Resolution, resolve
from .stack import FAKE_STACK_ENV_VAR, Stack, detect_stack, parse_version, stack_from_json, this_machine
from .switches import BACKEND_ENV_VAR, SWITCHES

__all__ = [
    "BACKEND_ENV_VAR",
    "FAKE_STACK_ENV_VAR",
    "FLA_MISSING",
    "INFERENCE",
    "KERNELS",
    "KNOWN_ISSUES",
    "NOTE",
    "OPS",
    "OP_SPECS",
    "PHASES",
    "SERVING",
    "STOP",
    "SWITCHES",
    "TRAINING",
    "WARN",
    "Call",
    "Choice",
    "EntryPoint",
    "Fact",
    "Family",
    "FixedCall",
    "Kernel",
    "KernelLoadError",
    "KernelUnavailable",
    "Key",
    "KnownIssue",
    "Op",
    "OpSpec",
    "Problem",
    "Resolution",
    "Selection",
    "Stack",
    "VersionRange",
    "bind",
    "detect_stack",
    "emit_once",
    "fixed_call",
    "fla_missing_message",
    "packed_attention",
    "packed_attention_function",
    "parse_version",
    "resolve",
    "run",
    "select",
    "stack_from_json",
    "this_machine",
    "triton_interpreter_enabled",
]

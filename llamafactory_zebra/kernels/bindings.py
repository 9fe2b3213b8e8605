"""The functions each op's entries run, bound as objects by the module that runs the op.

Why the ops bind their own code: the registry's table (``registry.py``) sits below every op, so naming an op's
functions there meant naming modules above ``kernels/`` as text and importing them at first run — edges the import
graph could not see, and rows a reader could not follow to their code. Instead the module that runs an op (the one
that calls ``decider.run`` for it, so it is imported whenever the op can run) binds its entries when it is imported::

    bind(Op.GATED_NORM, {Key.CPP: cpu_gated_rms_norm, Key.TORCH: gated_rms_norm_reference})

A binding is checked at once: one function for every entry of the op that has one (:attr:`Kernel.has_function`),
no key the op has no entry for, an entry point the op's record lists (``op_specs.OP_SPECS``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..kernel_names import EntryPoint, Key, Op
from .op_specs import OP_SPECS
from .registry import KERNELS, Kernel

_bound: dict[tuple[Op, EntryPoint], Mapping[Key, Callable]] = {}


def bind(op: Op, functions: Mapping[Key, Callable], entry_point: EntryPoint = EntryPoint.RUN) -> None:
    """Bind ``op``'s entries to ``functions`` at ``entry_point`` (binding again replaces: a reloaded module)."""
    points = OP_SPECS[op].entry_points
    if entry_point not in points:
        raise ValueError(f"{op}: no entry point {entry_point!r}; its entry points: {', '.join(points)}")
    keys = {kernel.key for kernel in KERNELS if kernel.op == op and kernel.has_function}
    unknown, missing = sorted(set(functions) - keys), sorted(keys - set(functions))
    if unknown or missing:
        raise ValueError(
            f"{op} at {entry_point}: bind exactly its entries {', '.join(sorted(keys))}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
            + (f"; missing: {', '.join(missing)}" if missing else "")
        )
    not_callable = sorted(key for key, function in functions.items() if not callable(function))
    if not_callable:
        raise TypeError(f"{op} at {entry_point}: the functions of {', '.join(not_callable)} are not callable")
    _bound[(op, entry_point)] = dict(functions)


def bound_function(kernel: Kernel, entry_point: EntryPoint = EntryPoint.RUN) -> Callable:
    """The function bound for ``kernel`` at ``entry_point``; a clear error when its op's module was never imported
    (the module that runs an op imports its own bindings, so this means a caller ran ``decider.run`` for an op
    from somewhere else)."""
    functions = _bound.get((kernel.op, entry_point))
    if functions is None:
        raise LookupError(
            f"{kernel.op}: no functions bound at {entry_point!r} (the module that runs it, for "
            f"{OP_SPECS[kernel.op].uses}, binds them with kernels.bind when it is imported)"
        )
    if kernel.key not in functions:
        raise LookupError(f"{kernel.op}: {kernel.key} has no function of its own (the caller does its work)")
    return functions[kernel.key]


def bound_ops() -> frozenset[tuple[Op, EntryPoint]]:
    """The (op, entry point) pairs bound so far in this process (the registry's tests check every pair is)."""
    return frozenset(_bound)

"""Loading fla's kernels for the ops, which the kernel registry (``kernels/registry.py``) chose.

fla (pip ``fla-core``) is the fast path on CUDA/ROCm GPUs; it needs Triton and a GPU, so it is an
optional dependency imported lazily, never at package import. Whether an op runs fla for a call is the
registry's ``select`` (``ZEBRA_GDN_BACKEND=auto|torch|fla``, ``kernels/switches.py``); this module only
imports what was chosen. A package that is installed but does not import raises
:class:`~llamafactory_zebra.kernels.KernelLoadError`, and the registry runs the next entry with one
warning per process (the one the entry points give), never silently.

CPU tensors reach fla only on explicit request under Triton's CPU interpreter: ``ZEBRA_GDN_BACKEND=fla``
together with ``TRITON_INTERPRET=1`` (Triton's own switch, read when triton is first imported). That
runs fla's real Triton kernels, slowly, on the CPU, which is how the test suite proves the GPU path
without a GPU (``tests/kernels/test_kernels_triton_interpreter.py``, ``docs/gpu.md``). ``auto`` never does it.
On ROCm, loading fla also caps its autotuning where ``kernels/known_issues.py`` says so
(``kernels/fla_seams.py``).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import ModuleType

from ..kernels import KernelLoadError
from ..kernels.fla_seams import install_stage_cap


@functools.cache
def fla_module(module: str) -> ModuleType | None:
    """Import an fla submodule (e.g. ``fla.ops.gated_delta_rule``) once; ``None`` if unavailable."""
    try:
        found = importlib.import_module(module)
    except Exception:  # Triton/driver problems surface as many exception types; all mean "not usable".
        return None
    install_stage_cap()
    return found


def first_fla_module(modules: tuple[str, ...]) -> ModuleType:
    """The first of ``modules`` that imports (fla moves modules between releases), or :class:`KernelLoadError`."""
    found = next((m for m in map(fla_module, modules) if m is not None), None)
    if found is None:
        raise KernelLoadError(f"{' and '.join(modules)} do not import")
    return found


def fla_function(modules: tuple[str, ...], name: str) -> Callable:
    """fla's ``name`` from the first of ``modules`` that imports, or :class:`KernelLoadError` naming it."""
    function = getattr(first_fla_module(modules), name, None)
    if function is None:
        raise KernelLoadError(f"{' and '.join(modules)} have no {name}")
    return function

"""Choosing between fla's Triton kernels and this package's PyTorch code.

fla (pip ``fla-core``) is the fast path on CUDA/ROCm GPUs; it needs Triton and a GPU, so it is an
optional dependency imported lazily, never at package import. ``ZEBRA_GDN_BACKEND`` forces a choice:
``torch`` (always the PyTorch code), ``fla`` (fail loudly if fla cannot run), ``auto`` (default:
fla when it imports and the tensors live on a GPU, PyTorch otherwise).

CPU tensors reach fla only on explicit request under Triton's CPU interpreter: ``ZEBRA_GDN_BACKEND=fla``
together with ``TRITON_INTERPRET=1`` (Triton's own switch, read when triton is first imported). That
runs fla's real Triton kernels, slowly, on the CPU, which is how the test suite proves the GPU path
without a GPU (``tests/kernels/test_kernels_triton_interpreter.py``, ``docs/gpu.md``). ``auto`` never does it.

The switch itself and the run-level decision (which kernel each part will use on this machine, and
which known-broken combinations stop a run) live in ``llamafactory_zebra.kernels``; this module makes
the per-tensor call. ``auto`` on a GPU tensor without fla falls back to PyTorch with one warning per
process (the same one the entry points give), never silently.
"""

from __future__ import annotations

import functools
import importlib
import logging
from types import ModuleType

import torch

from ..kernels import BACKEND_ENV_VAR, FLA_MISSING, emit_once, fla_missing_message
from ..kernels.switches import TRITON_INTERPRET_ENV_VAR, requested_backend, triton_interpreter_enabled

logger = logging.getLogger(__name__)


@functools.cache
def fla_module(module: str) -> ModuleType | None:
    """Import an fla submodule (e.g. ``fla.ops.gated_delta_rule``) once; ``None`` if unavailable."""
    try:
        return importlib.import_module(module)
    except Exception:  # Triton/driver problems surface as many exception types; all mean "not usable".
        return None


def fla_ops(tensor: torch.Tensor, *modules: str) -> ModuleType | None:
    """The fla module an op on ``tensor`` should call, or ``None`` for the PyTorch code.

    ``modules`` are candidate import paths, first match wins (fla moves modules between releases).
    fla is only imported for GPU tensors — or for CPU tensors when ``fla`` is forced under Triton's
    interpreter — so ordinary CPU runs never touch Triton.
    """
    choice = requested_backend()
    if choice == "torch":
        return None
    runnable = tensor.is_cuda or (choice == "fla" and triton_interpreter_enabled())
    found = next((m for m in map(fla_module, modules) if m is not None), None) if runnable else None
    if choice == "fla" and found is None:
        where = (
            "this tensor"
            if runnable
            else f"a {tensor.device.type} tensor (fla needs CUDA or ROCm, or {TRITON_INTERPRET_ENV_VAR}=1)"
        )
        raise RuntimeError(
            f"{BACKEND_ENV_VAR}=fla but fla ({' or '.join(modules)}) cannot run on {where}; "
            "install `fla-core` on a GPU machine or set it to auto/torch."
        )
    if found is None and tensor.is_cuda:
        emit_once(FLA_MISSING, fla_missing_message(), logger.warning)
    return found

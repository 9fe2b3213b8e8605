"""Choosing between fla's Triton kernels and this package's PyTorch code.

fla (pip ``fla-core``) is the fast path on CUDA/ROCm GPUs; it needs Triton and a GPU, so it is an
optional dependency imported lazily, never at package import. ``ZEBRA_GDN_BACKEND`` forces a choice:
``torch`` (always the PyTorch code), ``fla`` (fail loudly if fla cannot run), ``auto`` (default:
fla when it imports and the tensors live on a GPU, PyTorch otherwise).

CPU tensors reach fla only on explicit request under Triton's CPU interpreter: ``ZEBRA_GDN_BACKEND=fla``
together with ``TRITON_INTERPRET=1`` (Triton's own switch, read when triton is first imported). That
runs fla's real Triton kernels, slowly, on the CPU, which is how the test suite proves the GPU path
without a GPU (``tests/test_kernels_triton_interpreter.py``, ``docs/gpu.md``). ``auto`` never does it.
"""

from __future__ import annotations

import functools
import importlib
import os
from types import ModuleType

import torch

BACKEND_ENV_VAR = "ZEBRA_GDN_BACKEND"
TRITON_INTERPRET_ENV_VAR = "TRITON_INTERPRET"
_CHOICES = ("auto", "torch", "fla")


@functools.cache
def fla_module(module: str) -> ModuleType | None:
    """Import an fla submodule (e.g. ``fla.ops.gated_delta_rule``) once; ``None`` if unavailable."""
    try:
        return importlib.import_module(module)
    except Exception:  # Triton/driver problems surface as many exception types; all mean "not usable".
        return None


def requested_backend() -> str:
    choice = os.environ.get(BACKEND_ENV_VAR, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"{BACKEND_ENV_VAR}={choice!r} is not valid; use one of {', '.join(_CHOICES)}.")
    return choice


def triton_interpreter_enabled() -> bool:
    """Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``, as triton itself parses it)."""
    return os.environ.get(TRITON_INTERPRET_ENV_VAR, "0").strip().lower() in ("1", "true", "on", "yes")


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
    return found

"""The environment switches kernel choice reads: the plugin's GDN backend key, which PyTorch GDN formulation
runs when fla does not, whether the package's C++ CPU kernels are built and run, and Triton's interpreter flag."""

from __future__ import annotations

import os

BACKEND_ENV_VAR = "ZEBRA_GDN_BACKEND"
BACKEND_CHOICES = ("auto", "torch", "fla")
TRITON_INTERPRET_ENV_VAR = "TRITON_INTERPRET"


def requested_backend() -> str:
    """``ZEBRA_GDN_BACKEND``: ``auto`` (default), ``torch`` or ``fla``; anything else is refused."""
    choice = os.environ.get(BACKEND_ENV_VAR, "auto").strip().lower() or "auto"
    if choice not in BACKEND_CHOICES:
        raise ValueError(f"{BACKEND_ENV_VAR}={choice!r} is not valid; use one of {', '.join(BACKEND_CHOICES)}.")
    return choice


def triton_interpreter_enabled() -> bool:
    """Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``, as triton itself parses it)."""
    return os.environ.get(TRITON_INTERPRET_ENV_VAR, "0").strip().lower() in ("1", "true", "on", "yes")


# Which exact PyTorch formulation of the chunked gated delta rule runs when fla does not
# (``ops/gated_delta_rule/torch_path.py`` maps each name to its function): ``chunk`` (``chunk.py``, tuned for
# CPU threads, faster there: docs/benchmarks.md), ``parallel`` (``chunk_parallel.py``, whole-chunk batched work
# and one GEMM a chunk step, shaped for GPUs), ``parallel-compiled`` (its whole-chunk parts under
# torch.compile; opt-in, compiling costs tens of seconds per process).
TORCH_CHUNK_ENV_VAR = "ZEBRA_GDN_TORCH_CHUNK"
TORCH_CHUNK_CHOICES = ("chunk", "parallel", "parallel-compiled")


def torch_chunk_choice(on_gpu: bool) -> str:
    """``ZEBRA_GDN_TORCH_CHUNK``, read at each call: ``auto`` (default) picks ``parallel`` on CUDA/ROCm GPUs and
    ``chunk`` elsewhere; anything else must be one of ``TORCH_CHUNK_CHOICES``."""
    choice = os.environ.get(TORCH_CHUNK_ENV_VAR, "auto").strip().lower() or "auto"
    if choice == "auto":
        return "parallel" if on_gpu else "chunk"
    if choice not in TORCH_CHUNK_CHOICES:
        raise ValueError(
            f"{TORCH_CHUNK_ENV_VAR}={choice!r} is not valid; use one of auto, {', '.join(TORCH_CHUNK_CHOICES)}."
        )
    return choice


# The package's C++ CPU kernels for inference (``ops/cpu_extension.py``: serving's GDN decode step and prompt
# chunks, the gated RMSNorm): ``auto`` builds them on first use and runs them where they fit, ``torch`` keeps
# their PyTorch paths.
CPU_KERNELS_ENV_VAR = "ZEBRA_CPU_KERNELS"
CPU_KERNELS_CHOICES = ("auto", "torch")


def cpu_kernels_choice() -> str:
    """``ZEBRA_CPU_KERNELS``, read at each call: ``auto`` (default) or ``torch``; anything else is refused."""
    choice = os.environ.get(CPU_KERNELS_ENV_VAR, "auto").strip().lower() or "auto"
    if choice not in CPU_KERNELS_CHOICES:
        raise ValueError(
            f"{CPU_KERNELS_ENV_VAR}={choice!r} is not valid; use one of {', '.join(CPU_KERNELS_CHOICES)}."
        )
    return choice

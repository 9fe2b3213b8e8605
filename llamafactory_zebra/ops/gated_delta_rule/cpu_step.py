"""A C++ decode step for fp32 GDN state slots on CPU, built on first use with PyTorch's extension builder.

Why a kernel of our own: vLLM's CPU GDN kernel refuses Zebra's head sizes (key 256, value 512), and the
PyTorch step (``in_slots.py::_step_in_place``) is bound by how BLAS runs its two state products: a ``bmm``
with two rows per head packs the whole state first, so it moves the 3 MB a sequence several times at a
third of this machine's read bandwidth, and a decode step is mostly that. ``cpu_step.cpp`` reads each
head's state once for both products and updates it while it is still in cache (speed:
``benchmarks/bench_vllm_gdn_cpu.py``, figures in ``docs/benchmarks.md``). It is built with
``torch.utils.cpp_extension.load`` for this CPU (``-march=native``; the build directory is named after
the CPU, torch and Python so that no other machine or venv loads it) and cached by PyTorch; a machine
without a C++ compiler, or a failed build, keeps the PyTorch step with one warning.
``ZEBRA_GDN_CPU_STEP=torch`` (``kernels/switches.py``) keeps the PyTorch step.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import platform
import sys
from pathlib import Path
from types import ModuleType

import torch

from ...kernels.switches import cpu_step_choice

logger = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("cpu_step.cpp")


def _build_name() -> str:
    """A name per CPU model and flags, torch and Python: the build is native code for one of each."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = "".join(line for line in lines[:30] if line.startswith(("model name", "flags", "Features")))
    key = f"{platform.machine()}|{cpu}|{torch.__version__}|{sys.version_info[:2]}"
    return f"zebra_gdn_cpu_step_{hashlib.sha256(key.encode()).hexdigest()[:12]}"


@functools.cache
def _build() -> ModuleType | None:
    from torch.utils.cpp_extension import load

    try:
        return load(
            name=_build_name(),
            sources=[str(SOURCE)],
            extra_cflags=["-O3", "-march=native", "-fopenmp-simd"],
            verbose=False,
        )
    except Exception as error:  # no compiler, no headers, a failed build: the PyTorch step still works
        logger.warning(
            "llamafactory-zebra: could not build the C++ GDN decode step (%s: %s); serving keeps the PyTorch "
            "step, which is slower on CPU (docs/benchmarks.md). Set ZEBRA_GDN_CPU_STEP=torch to skip the build.",
            type(error).__name__,
            str(error).splitlines()[0] if str(error) else "",
        )
        return None


def cpu_step_kernel() -> ModuleType | None:
    """The built kernel module, or None where the PyTorch step runs (switch set to ``torch``, not Linux, or
    the build failed). The first call builds (tens of seconds) or loads the cached build."""
    if cpu_step_choice() == "torch" or not sys.platform.startswith("linux"):
        return None
    return _build()


def cpu_step_in_slots(
    kernel: ModuleType,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
) -> torch.Tensor:
    """Advance ``state[state_indices[i]]`` by token i in place and return ``o`` ``[N, H, V]`` (fp32).

    q, k ``[N, H, K]`` (normalised, q scaled), v ``[N, H, V]``, decay = exp(g) and beta ``[N, H]``, all fp32;
    ``state`` fp32 ``[slots, H, K, V]`` with rows of V contiguous (:func:`cpu_step_fits`)."""
    return kernel.gated_delta_step_in_slots(
        state, state_indices.to(torch.int64).contiguous(), *(t.contiguous() for t in (q, k, v, decay, beta))
    )


def cpu_step_fits(state: torch.Tensor, compute_dtype: torch.dtype) -> bool:
    """Whether the kernel takes this cache: a CPU fp32 state with rows of V contiguous, computed in fp32."""
    return (
        state.device.type == "cpu"
        and state.dtype == torch.float32
        and compute_dtype == torch.float32
        and state.stride(-1) == 1
    )

"""The package's C++ kernels for CPU inference: one extension, built on first use with PyTorch's builder.

Each kernel's Python module says why it exists (``gated_delta_rule/cpu_step.py``: the GDN decode step on
state slots; ``gated_delta_rule/chunk_prefill.py``: prompt chunks on state slots; ``gated_rms_norm.py``: the
gated RMSNorm that closes a GDN layer). They share one build:
``torch.utils.cpp_extension.load`` compiles ``SOURCES`` for this CPU (``-march=native``; the build directory
is named after the CPU, torch and Python, so no other machine or venv loads it) and PyTorch caches it. A
machine without a C++ compiler, or a failed build, keeps every kernel's PyTorch path, with one warning.
Which kernel an op runs is the kernel registry's choice (``kernels/registry.py``: the ``cpp`` entries, which
``ZEBRA_CPU_KERNELS=torch`` leaves out); the ops call :func:`cpu_kernels` only when it chose one of them.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import sys
from pathlib import Path
from types import ModuleType

import torch

from ..kernels import KernelLoadError
from ..kernels.stack import cpu_identity
from ..kernels.switches import CPU_KERNELS_ENV_VAR

logger = logging.getLogger(__name__)
HERE = Path(__file__).parent
# The bindings first; each further file holds one kernel. HEADERS are what the kernels share.
SOURCES = (
    HERE / "cpu_extension.cpp",
    HERE / "gated_delta_rule" / "cpu_step.cpp",
    HERE / "gated_delta_rule" / "cpu_prefill.cpp",
    HERE / "gated_rms_norm.cpp",
)
HEADERS = (HERE / "cpu_values.h",)


def _build_name() -> str:
    """A name per CPU model and flags, torch, Python and the sources: the build is native code for one of each.
    The sources' directory is part of it too: PyTorch's build file names each source by its path, so two
    installs sharing one extension cache under one name would each rebuild what the other built."""
    code = "".join(source.read_text() for source in (*SOURCES, *HEADERS))
    key = f"{cpu_identity()}|{torch.__version__}|{sys.version_info[:2]}|{HERE}|{code}"
    return f"zebra_cpu_kernels_{hashlib.sha256(key.encode()).hexdigest()[:12]}"


@functools.cache
def _build() -> ModuleType | None:
    from torch.utils.cpp_extension import load

    try:
        return load(
            name=_build_name(),
            sources=[str(source) for source in SOURCES],
            extra_cflags=["-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno"],
            verbose=False,
        )
    except Exception as error:  # no compiler, no headers, a failed build: the PyTorch paths still work
        logger.warning(
            "llamafactory-zebra: could not build the C++ CPU kernels (%s: %s); serving keeps their PyTorch "
            "paths, which are slower on CPU (docs/benchmarks.md). Set %s=torch to skip the build.",
            type(error).__name__,
            str(error).splitlines()[0] if str(error) else "",
            CPU_KERNELS_ENV_VAR,
        )
        return None


def cpu_kernels() -> ModuleType:
    """The built extension, for an op whose ``cpp`` registry entry was chosen. The first call builds (tens of
    seconds) or loads the cached build; a build that failed raises
    :class:`~llamafactory_zebra.kernels.KernelLoadError`, so the registry passes the entry over from then on and
    the op runs the next one."""
    kernels = _build()
    if kernels is None:
        raise KernelLoadError("the package's C++ CPU kernels did not build (the warning above says why)")
    return kernels

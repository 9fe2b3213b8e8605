"""The one build of the package's C++ CPU kernels: announced, done once per install, safe to interrupt.

``torch.utils.cpp_extension.load`` compiles ``SOURCES`` for this CPU (``-march=native``; the build's name
covers the CPU, torch, Python, the sources and their directory, so no other machine, venv or install loads
it) into a directory of PyTorch's extension cache (``TORCH_EXTENSIONS_DIR`` when set) and loads it. Which
kernel an op runs is the kernel registry's choice (``kernels/registry.py``: the ``cpp`` entries, which
``ZEBRA_CPU_KERNELS=torch`` leaves out); the ops call :func:`cpu_kernels` only when it chose one of them, and
``llamafactory-zebra build-kernels`` calls it ahead of time.

Why the care around ``load``: the build takes minutes (docs/benchmarks.md) inside whatever command first
needs a kernel, and PyTorch prints nothing while it compiles, so :func:`load_extension` says what it builds
and how to skip it first. Processes that start together take an OS lock (``flock``: the kernel drops it
when its holder dies, however it dies) on the build directory, so one builds and the others wait, say so,
and load what it built. Inside that lock a ``lock`` file left in the directory can only be the baton of a
killed build (torch before 2.14 marks a build by that file's existence, so a killed builder leaves every
later one waiting forever); it is removed. A killed build leaves no ``built`` mark, so the next process
announces the build again and ninja redoes what did not finish. A machine without a C++ compiler, or a
failed build, keeps every kernel's PyTorch path, with one warning.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import torch

from ...kernels import KernelLoadError
from ...kernels.stack import cpu_identity
from ...kernels.switches import CPU_KERNELS_ENV_VAR

# Warnings: Python's last-resort handler shows them when nothing configured logging (LLaMA-Factory and
# transformers configure only their own loggers), so a user of ``llamafactory-cli chat`` sees a build start.
logger = logging.getLogger(__name__)
HERE = Path(__file__).parent
# The bindings first; each further file holds one kernel. HEADERS are what the kernels share.
SOURCES = (HERE / "bindings.cpp", HERE / "cpu_step.cpp", HERE / "cpu_prefill.cpp", HERE / "gated_rms_norm.cpp")
HEADERS = (HERE / "cpu_values.h",)
WHAT = f"the package's C++ CPU kernels ({', '.join(source.name for source in SOURCES[1:])})"  # as the logs name it
CFLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno")
BUILT_MARK = "built"  # written into the build directory once its module has loaded
OUR_LOCK = "zebra-build.lock"  # the flock the package's processes share
TORCH_BATON = "lock"  # torch's own lock file in the build directory


def _build_name() -> str:
    """A name per CPU model and flags, torch, Python and the sources: the build is native code for one of each.
    The sources' directory is part of it too: PyTorch's build file names each source by its path, so two
    installs sharing one extension cache under one name would each rebuild what the other built."""
    code = "".join(source.read_text() for source in (*SOURCES, *HEADERS))
    key = f"{cpu_identity()}|{torch.__version__}|{sys.version_info[:2]}|{HERE}|{code}"
    return f"zebra_cpu_kernels_{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def build_directory(name: str) -> Path:
    """Where ``load`` builds ``name``: ``TORCH_EXTENSIONS_DIR/name`` when that is set, else under PyTorch's
    per-user cache. Asked of PyTorch's own helper, the one ``load`` calls, so the lock guards that very
    directory."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False))


def is_built(directory: Path) -> bool:
    """Whether a build in ``directory`` finished and loaded (a killed or failed one leaves no mark)."""
    return (directory / BUILT_MARK).exists()


@contextlib.contextmanager
def _build_lock(directory: Path, what: str) -> Iterator[None]:
    """Hold the build directory's OS lock; say so when another process holds it (it is building)."""
    import fcntl  # POSIX: the registry offers the C++ kernels on Linux only

    with open(directory / OUR_LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.warning(
                "llamafactory-zebra: another process is building %s in %s; waiting for it to finish, then loading "
                "its build.",
                what,
                directory,
            )
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load_extension(name: str, sources: Sequence[Path], cflags: Sequence[str], what: str) -> ModuleType:
    """Build ``sources`` as extension ``name`` unless a build finished before, and load it: once per build
    directory across processes, announced before it starts and when it ends. ``what`` names the build in
    those lines. Raises what ``load`` raises when the build fails."""
    from torch.utils.cpp_extension import load

    directory = build_directory(name)
    with _build_lock(directory, what):
        (directory / TORCH_BATON).unlink(missing_ok=True)  # no live process holds it: we hold the lock
        fresh = not is_built(directory)
        if fresh:
            logger.warning(
                "llamafactory-zebra: building %s for this CPU into %s. They make CPU inference faster; the build "
                "happens once per install and takes a few minutes (`llamafactory-zebra build-kernels` does it "
                "ahead of time; %s=torch skips it and keeps the slower PyTorch paths).",
                what,
                directory,
                CPU_KERNELS_ENV_VAR,
            )
        started = time.monotonic()
        module = load(
            name=name,
            sources=[str(source) for source in sources],
            extra_cflags=list(cflags),
            build_directory=str(directory),
            verbose=False,
        )
        if fresh:
            (directory / BUILT_MARK).touch()
            logger.warning("llamafactory-zebra: built %s in %.0f s.", what, time.monotonic() - started)
    return module


@functools.cache
def _build() -> ModuleType | None:
    try:
        return load_extension(_build_name(), SOURCES, CFLAGS, WHAT)
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
    """The built extension, for an op whose ``cpp`` registry entry was chosen. The first call in a process
    builds it (announced; minutes, once per install) or loads the finished build; a build that failed raises
    :class:`~llamafactory_zebra.kernels.KernelLoadError`, so the registry passes the entry over from then on and
    the op runs the next one."""
    kernels = _build()
    if kernels is None:
        raise KernelLoadError("the package's C++ CPU kernels did not build (the warning above says why)")
    return kernels


def package_build_directory() -> Path:
    """Where the package's kernels build on this machine (``build-kernels`` names it)."""
    return build_directory(_build_name())

"""``llamafactory-zebra build-kernels``: build the package's C++ CPU kernels now, not inside the first
inference command.

The kernels make CPU inference faster and build on first use otherwise (announced; ``ops/cpu/build.py``), so
the quickstarts and ``scripts/test.sh`` run this as a visible step after installing. It builds and loads
them, or loads the finished build ("already built"), or says why this machine cannot build them (the kernel
registry's own reason: not Linux, no C++ compiler). Exit status: 0 when they load, 1 when they cannot be
built here or the build failed (the PyTorch paths still run; the message says why).
"""

from __future__ import annotations

import argparse
import os

from .commands import SUBCOMMANDS


def _cannot_build_here() -> str | None:
    """Why the registry would not offer the C++ kernels on this machine (``None``: it would)."""
    from ..kernels import KERNELS, Family, Op, detect_stack

    entry = next(kernel for kernel in KERNELS if kernel.op == Op.GATED_NORM and kernel.family == Family.CPP)
    return entry.needs(detect_stack())


def run(args: argparse.Namespace) -> int:
    from ..kernels import KernelLoadError
    from ..kernels.switches import CPU_KERNELS_ENV_VAR
    from ..ops.cpu.build import WHAT, cpu_kernels, is_built, package_build_directory

    why_not = _cannot_build_here()
    if why_not:
        print(
            f"llamafactory-zebra build-kernels: this machine cannot build {WHAT}: {why_not}; the ops run their "
            "PyTorch paths."
        )
        return 1
    if os.environ.get(CPU_KERNELS_ENV_VAR) == "torch":
        print(
            f"llamafactory-zebra build-kernels: {CPU_KERNELS_ENV_VAR}=torch is set, so the ops keep their PyTorch "
            "paths while it is; building anyway."
        )
    directory = package_build_directory()
    built_before = is_built(directory)
    try:
        cpu_kernels()
    except KernelLoadError:
        print(f"llamafactory-zebra build-kernels: {WHAT} did not build (the warning above says why).")
        return 1
    state = "already built" if built_before else "now built"  # by this process or one it waited for
    print(f"llamafactory-zebra build-kernels: {WHAT} {state} and loaded ({directory}).")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "build-kernels",
        help=SUBCOMMANDS["build-kernels"].help,
        description="Build (once per install, a few minutes) and load the package's C++ CPU kernels, so no "
        "inference command builds them by surprise. Exit code 0: they load; 1: this machine cannot build them "
        "or the build failed (the PyTorch paths still run).",
    )
    parser.set_defaults(func=run)

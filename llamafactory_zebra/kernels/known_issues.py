"""Kernel/version/device combinations known to give wrong results or stop a run: the data, one entry each.

An entry matches a :class:`~.stack.Stack` when the part it concerns runs the named kernel family, the
device vendor and compute capability fall in its range, every versioned package is installed within
its range and the run has the affected phase (``"backward"``: training only; ``"forward"``: every run).
``resolver.py`` reads the entries; nothing else in the package hard-codes one. Add an entry here when an
upstream bug is confirmed; cite the upstream threads and give fixes a user can run.
"""

from __future__ import annotations

from dataclasses import dataclass

from .stack import Stack, parse_version
from .switches import BACKEND_ENV_VAR

PHASES = ("forward", "backward")
# The one GPU measurement of the PyTorch GDN path there is (docs/gpu.md: one H200, torch 2.11, bf16, gradient
# checkpointing, Liger CE, one unpacked row; the full Zebra against a same-width Qwen3-1.7B, training tokens/s).
# It was taken with ``chunk.py``; the GPU-shaped ``parallel`` formulation a GPU now gets has not run on one yet.
TORCH_GDN_MEASURED_COST = (
    "0.19x / 0.33x the training tokens/s of a same-width Qwen3-1.7B at 8k / 32k tokens (H200, measured with "
    "chunk.py; the GPU-shaped parallel formulation now used on GPUs is not yet measured there)"
)


@dataclass(frozen=True)
class VersionRange:
    """``package`` installed at a version ``>= low`` and ``< high`` (either bound may be open)."""

    package: str
    low: str | None = None
    high: str | None = None

    def contains(self, version: str | None) -> bool:
        if version is None:
            return False
        release = parse_version(version)
        if self.low is not None and release < parse_version(self.low):
            return False
        return self.high is None or release < parse_version(self.high)

    def __str__(self) -> str:
        bounds = [f">={self.low}" if self.low else "", f"<{self.high}" if self.high else ""]
        return f"{self.package} {','.join(b for b in bounds if b) or '(any version)'}"


@dataclass(frozen=True)
class KnownIssue:
    key: str
    part: str  # the resolved part it concerns (``resolver.PARTS``)
    kernel_family: str  # the kernel family of that part it concerns (``resolver`` labels its choices with one)
    summary: str
    vendor: str  # "cuda" or "rocm"
    capability_from: tuple[int, int]  # inclusive
    capability_below: tuple[int, int]  # exclusive
    versions: tuple[VersionRange, ...]
    phase: str  # "forward" or "backward"
    upstream: tuple[str, ...]
    fixes: tuple[str, ...]  # what a user can do, best first
    # An installed package that routes the affected kernel elsewhere (the issue is then a warning, not a stop).
    avoided_by: str | None = None
    avoided_note: str = ""

    def matches(self, stack: Stack, phase_needed: tuple[str, ...]) -> bool:
        if self.phase not in phase_needed or stack.device != self.vendor or stack.capability is None:
            return False
        if not self.capability_from <= stack.capability < self.capability_below:
            return False
        return all(r.contains(stack.version(r.package)) for r in self.versions)

    def avoided(self, stack: Stack) -> bool:
        return self.avoided_by is not None and stack.version(self.avoided_by) is not None

    def where(self) -> str:
        low, high = self.capability_from, self.capability_below
        return f"{self.vendor} compute capability >= {low[0]}.{low[1]} and < {high[0]}.{high[1]}"


KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue(
        key="fla-hopper-triton-gated-bwd",
        part="GDN chunk",
        kernel_family="fla",
        summary=(
            "Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs miscompiles fla's gated chunk_bwd_dqkwg (the GDN "
            "backward); fla raises at the first backward, after its kernels compiled (~140 s on an H200)"
        ),
        vendor="cuda",
        capability_from=(9, 0),
        capability_below=(10, 0),
        versions=(VersionRange("fla-core"), VersionRange("triton", "3.4.0", "3.7.1")),
        phase="backward",
        upstream=(
            "fla-org/flash-linear-attention#640",
            "fla-org/flash-linear-attention#826",
            "fla-org/flash-linear-attention#983",
            "unslothai/unsloth#5276",
            "unslothai/unsloth-zoo#1010",
        ),
        fixes=(
            'upgrade Triton: pip install "triton>=3.7.1" (or a torch >= 2.12.1, which ships Triton 3.7.1)',
            "or install TileLang, which fla then uses for this kernel (needs nvcc on PATH): pip install tilelang",
            f"or set {BACKEND_ENV_VAR}=torch to train the GDN layers with the PyTorch path, measured at "
            f"{TORCH_GDN_MEASURED_COST}",
        ),
        avoided_by="tilelang",
        avoided_note=(
            "tilelang is installed: fla routes chunk_bwd_dqkwg to TileLang when nvcc is on PATH and the call "
            "passes its checks, else fla's guard stops the first backward (unverified for Zebra on a GPU)"
        ),
    ),
)

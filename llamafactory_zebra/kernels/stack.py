"""The facts kernel resolution starts from: the device (vendor, compute capability) and what is installed.

Gathered once per process by :func:`detect_stack` from torch and ``importlib.metadata`` (the installed
distributions' versions, without importing them: importing fla or Triton on a broken driver can hang
or crash, and the resolver must run before anything heavy). Tests and diagnosis describe another
machine with :data:`FAKE_STACK_ENV_VAR` (JSON, see :func:`stack_from_json`) or by building a
:class:`Stack` directly; without the variable the real device wins.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

# A test/diagnosis aid: describe a machine instead of detecting this one, e.g.
# ZEBRA_FAKE_STACK='{"device": "cuda", "capability": [9, 0], "name": "NVIDIA H200",
#                    "versions": {"torch": "2.11.0", "triton": "3.6.0", "fla-core": "0.6.0"}}'
FAKE_STACK_ENV_VAR = "ZEBRA_FAKE_STACK"
DEVICES = ("cuda", "rocm", "cpu")
# The distributions whose presence and version decide a kernel (pip names). ROCm's torch ships Triton as
# ``pytorch-triton-rocm``; :meth:`Stack.version` answers ``triton`` for either.
DISTRIBUTIONS = ("torch", "triton", "pytorch-triton-rocm", "fla-core", "tilelang", "flash-attn", "liger-kernel")


def parse_version(text: str) -> tuple[int, ...]:
    """The numeric release of a version string: ``"2.11.0+cu130"`` → ``(2, 11, 0)``, ``"3.7.1rc1"`` → ``(3, 7, 1)``.

    Only the leading dotted integers count (a pre-release compares equal to its release), which is all
    the known-issue ranges need; the kernels package stays on the standard library.
    """
    found = re.match(r"\d+(?:\.\d+)*", text.strip())
    if found is None:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(part) for part in found.group(0).split("."))


@dataclass(frozen=True)
class Stack:
    """One machine as kernel resolution sees it."""

    device: str  # "cuda" (NVIDIA), "rocm" (AMD) or "cpu"
    name: str = "CPU"
    capability: tuple[int, int] | None = None  # CUDA compute capability, e.g. (9, 0) for Hopper
    arch: str = ""  # e.g. "sm_90" or "gfx942"
    versions: Mapping[str, str] = field(default_factory=dict)  # installed distributions only
    faked: bool = False

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r} is not one of {', '.join(DEVICES)}")

    @property
    def has_gpu(self) -> bool:
        return self.device != "cpu"

    def version(self, distribution: str) -> str | None:
        """The installed version of ``distribution`` (pip name), ``None`` when absent."""
        if distribution == "triton":
            return self.versions.get("triton") or self.versions.get("pytorch-triton-rocm")
        return self.versions.get(distribution)

    def on_cpu(self) -> Stack:
        """The same software with the GPU out of the picture (``use_cpu: true``)."""
        return replace(self, device="cpu", name="CPU", capability=None, arch="")

    def describe(self) -> str:
        where = self.name if not self.has_gpu else f"{self.name} ({self.arch or self.device})"
        return where + (f" [faked by {FAKE_STACK_ENV_VAR}]" if self.faked else "")


def installed_versions(distributions: tuple[str, ...] = DISTRIBUTIONS) -> dict[str, str]:
    found = {}
    for distribution in distributions:
        try:
            found[distribution] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def stack_from_json(text: str) -> Stack:
    """A :class:`Stack` from :data:`FAKE_STACK_ENV_VAR`'s JSON; every key but ``device`` is optional.

    ``versions`` lists exactly what the fake machine has installed (a package left out is missing).
    """
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        device = data["device"]
        capability = data.get("capability")
        capability = (int(capability[0]), int(capability[1])) if capability is not None else None
        arch = data.get("arch") or (f"sm_{capability[0]}{capability[1]}" if capability and device == "cuda" else "")
        return Stack(
            device=device,
            name=data.get("name", "CPU" if device == "cpu" else f"fake {device} GPU"),
            capability=capability,
            arch=arch,
            versions={str(k): str(v) for k, v in (data.get("versions") or {}).items()},
            faked=True,
        )
    except (ValueError, KeyError, TypeError, IndexError) as error:
        raise ValueError(
            f"{FAKE_STACK_ENV_VAR} is not a valid machine description ({error}); expected JSON such as "
            '{"device": "cuda", "capability": [9, 0], "name": "NVIDIA H200", "versions": {"triton": "3.6.0"}} '
            f"with device one of {', '.join(DEVICES)}"
        ) from None


def _real_stack() -> Stack:
    import torch

    versions = installed_versions()
    if not torch.cuda.is_available():
        return Stack(device="cpu", versions=versions)
    props = torch.cuda.get_device_properties(0)
    if getattr(torch.version, "hip", None):
        arch = (getattr(props, "gcnArchName", "") or "").split(":")[0]
        return Stack("rocm", props.name, (props.major, props.minor), arch, versions)
    return Stack("cuda", props.name, (props.major, props.minor), f"sm_{props.major}{props.minor}", versions)


@functools.cache
def _cached_stack(fake: str | None) -> Stack:
    return stack_from_json(fake) if fake else _real_stack()


def detect_stack() -> Stack:
    """This machine (first GPU), or the one described by :data:`FAKE_STACK_ENV_VAR` when it is set."""
    return _cached_stack(os.environ.get(FAKE_STACK_ENV_VAR) or None)

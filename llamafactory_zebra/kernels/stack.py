"""The one probe of the machine: its GPUs (vendor, architecture, compute capability), the installed
distributions, the CPU's features and the C++ compiler — every fact a kernel choice, ``doctor``, the
training guards, ``verify`` and ``convert`` read about the hardware comes from this module.

:func:`this_machine` probes once per process, from torch and ``importlib.metadata`` (the installed
distributions' versions, without importing them: importing fla or Triton on a broken driver can hang
or crash, and kernel resolution must run before anything heavy). :func:`detect_stack` is what kernel
*choice* reads: this machine, or the one :data:`FAKE_STACK_ENV_VAR` describes (JSON, see
:func:`stack_from_json`) for tests and diagnosis. Code that *acts* on the hardware (moves a model to the
GPU, asks Linux for AMX tiles) reads :func:`this_machine`, never a fake. ``doctor``'s wider look
(every GPU, the vendor tools, bf16 support, NUMA balancing) is :func:`gpu_inventory`,
:func:`vendor_gpus_present` and :func:`numa_balancing`.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

# A test/diagnosis aid: describe a machine instead of detecting this one, e.g.
# ZEBRA_FAKE_STACK='{"device": "cuda", "capability": [9, 0], "name": "NVIDIA H200",
#                    "versions": {"torch": "2.11.0", "triton": "3.6.0", "fla-core": "0.6.0"}}'
FAKE_STACK_ENV_VAR = "ZEBRA_FAKE_STACK"
DEVICES = ("cuda", "rocm", "cpu")
# The distributions whose presence and version decide a kernel (pip names). ROCm's torch ships Triton as
# ``pytorch-triton-rocm``; :meth:`Stack.version` answers ``triton`` for either.
DISTRIBUTIONS = (
    "torch",
    "triton",
    "pytorch-triton-rocm",
    "fla-core",
    "tilelang",
    "flash-attn",
    "liger-kernel",
    "vllm",
)
# CPU features a kernel choice reads, as PyTorch's own probes report them.
AVX512_BF16, AMX_TILE, ARM_BF16 = "avx512_bf16", "amx_tile", "arm_bf16"
CPU_FEATURES = (AVX512_BF16, AMX_TILE, ARM_BF16)


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
    """One machine as kernel choice sees it."""

    device: str  # "cuda" (NVIDIA), "rocm" (AMD) or "cpu": where the first GPU is, or that there is none
    name: str = "CPU"
    capability: tuple[int, int] | None = None  # CUDA compute capability, e.g. (9, 0) for Hopper, (9, 4) MI300X
    arch: str = ""  # e.g. "sm_90" or "gfx942"
    versions: Mapping[str, str] = field(default_factory=dict)  # installed distributions only
    cpu_features: frozenset[str] = frozenset()  # of CPU_FEATURES
    compiler: str | None = None  # the C++ compiler torch's extension builder runs (``CXX`` or ``c++``), if any
    platform: str = "linux"  # ``sys.platform``
    toolkit: str | None = None  # the GPU toolkit torch is built for: "CUDA 13.0", "ROCm 6.4" (None: a CPU build)
    faked: bool = False

    def __hash__(self) -> int:  # ``versions`` is a dict: hashed by its items, once (kernel choice caches per stack)
        return self._hash

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r} is not one of {', '.join(DEVICES)}")
        unknown = set(self.cpu_features) - set(CPU_FEATURES)
        if unknown:
            raise ValueError(f"cpu_features {sorted(unknown)} are not among {', '.join(CPU_FEATURES)}")
        fields = (self.device, self.name, self.capability, self.arch, tuple(sorted(self.versions.items())))
        fields += (self.cpu_features, self.compiler, self.platform, self.toolkit, self.faked)
        object.__setattr__(self, "_hash", hash(fields))

    @property
    def has_gpu(self) -> bool:
        return self.device != "cpu"

    @property
    def rocm_build(self) -> bool:
        """torch is a ROCm build (its GPUs report as ``cuda`` devices), with or without a visible GPU."""
        return self.device == "rocm" or (self.toolkit or "").startswith("ROCm")

    @property
    def cpu_bf16_dot_products(self) -> bool:
        """bf16 GEMMs run natively (faster than fp32) on this CPU: AVX-512-BF16 or AMX, or Arm's bf16
        extension; elsewhere PyTorch emulates them slowly."""
        return bool(self.cpu_features & {AVX512_BF16, AMX_TILE, ARM_BF16})

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

    ``versions``, ``cpu_features`` and ``compiler`` say exactly what the fake machine has (a package, a
    feature or a compiler left out is missing); ``platform`` defaults to ``linux``.
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
            cpu_features=frozenset(data.get("cpu_features") or ()),
            compiler=data.get("compiler"),
            platform=data.get("platform", "linux"),
            toolkit=data.get("toolkit"),
            faked=True,
        )
    except (ValueError, KeyError, TypeError, IndexError) as error:
        raise ValueError(
            f"{FAKE_STACK_ENV_VAR} is not a valid machine description ({error}); expected JSON such as "
            '{"device": "cuda", "capability": [9, 0], "name": "NVIDIA H200", "versions": {"triton": "3.6.0"}} '
            f"with device one of {', '.join(DEVICES)}"
        ) from None


def _cpu_features() -> frozenset[str]:
    """PyTorch's own CPU probes (cpuinfo), the ones its kernels dispatch on."""
    import torch

    found = set()
    if torch.cpu._is_avx512_bf16_supported():
        found.add(AVX512_BF16)
    if torch.cpu._is_amx_tile_supported():
        found.add(AMX_TILE)
    if platform.machine().lower() in ("aarch64", "arm64") and torch.cpu.get_capabilities().get("bf16", False):
        found.add(ARM_BF16)
    return frozenset(found)


@functools.cache
def cpu_identity() -> str:
    """This CPU's architecture, model and instruction-set flags (``/proc/cpuinfo`` on Linux): what a binary
    compiled with ``-march=native`` depends on (``ops/cpu/build.py`` names its build after it)."""
    try:
        lines = open("/proc/cpuinfo").read().splitlines()
    except OSError:
        lines = [platform.processor()]
    described = [line for line in lines[:30] if line.startswith(("model name", "flags", "Features"))]
    return f"{platform.machine()}|{''.join(described or lines[:1])}"


def _compiler() -> str | None:
    """The C++ compiler ``torch.utils.cpp_extension`` would call (it runs ``$CXX``, else ``c++``)."""
    return shutil.which(os.environ.get("CXX", "c++"))


def _toolkit() -> str | None:
    import torch

    hip = getattr(torch.version, "hip", None)
    if hip:
        return f"ROCm {hip}"
    return f"CUDA {torch.version.cuda}" if torch.version.cuda else None


@functools.cache
def this_machine() -> Stack:
    """This machine, probed once per process (first GPU), whatever :data:`FAKE_STACK_ENV_VAR` says."""
    import torch

    software = {
        "versions": installed_versions(),
        "cpu_features": _cpu_features(),
        "compiler": _compiler(),
        "platform": sys.platform,
        "toolkit": _toolkit(),
    }
    if not torch.cuda.is_available():
        return Stack(device="cpu", **software)
    props = torch.cuda.get_device_properties(0)
    if getattr(torch.version, "hip", None):
        arch = (getattr(props, "gcnArchName", "") or "").split(":")[0]
        return Stack("rocm", props.name, (props.major, props.minor), arch, **software)
    return Stack("cuda", props.name, (props.major, props.minor), f"sm_{props.major}{props.minor}", **software)


@functools.cache
def _faked_stack(fake: str) -> Stack:
    return stack_from_json(fake)


def detect_stack() -> Stack:
    """The machine kernel choice reads: the one :data:`FAKE_STACK_ENV_VAR` describes when it is set, else
    :func:`this_machine`."""
    fake = os.environ.get(FAKE_STACK_ENV_VAR) or None
    return _faked_stack(fake) if fake else this_machine()


@dataclass(frozen=True)
class GpuInventory:
    """Every GPU torch sees, for ``doctor``."""

    names: tuple[str, ...]
    archs: tuple[str, ...]  # "sm_90", "gfx942", one per GPU
    bf16: bool  # the first GPU computes in bf16
    built_for: tuple[str, ...]  # the architectures this torch build has kernels for


def gpu_inventory() -> GpuInventory:
    import torch

    if not torch.cuda.is_available():
        return GpuInventory((), (), False, ())
    names, archs = [], []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        names.append(props.name)
        archs.append((getattr(props, "gcnArchName", "") or f"sm_{props.major}{props.minor}").split(":")[0])
    built_for = tuple(sorted({a.split(":")[0] for a in torch.cuda.get_arch_list()}))
    return GpuInventory(tuple(names), tuple(archs), torch.cuda.is_bf16_supported(), built_for)


def _tool_output(command: list[str]) -> str:
    """Output of a vendor tool (``rocminfo``, ``nvidia-smi``), '' when absent or failing."""
    if shutil.which(command[0]) is None:
        return ""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def numa_balancing() -> bool | None:
    """Whether the kernel balances memory across NUMA nodes (AMD advises it off for training); None: unknown."""
    try:
        with open("/proc/sys/kernel/numa_balancing", encoding="utf-8") as f:
            return f.read().strip() != "0"
    except OSError:
        return None


def vendor_gpus_present() -> tuple[bool, bool]:
    """(AMD, NVIDIA) GPUs in the machine whatever torch sees: ``rocminfo`` agents or ``/dev/kfd``, and
    ``nvidia-smi -L``. Starts the vendor tools: for ``doctor``, not for every process."""
    amd = bool(re.findall(r"Name:\s+(gfx\w+)", _tool_output(["rocminfo"]))) or os.path.exists("/dev/kfd")
    return amd, "GPU " in _tool_output(["nvidia-smi", "-L"])

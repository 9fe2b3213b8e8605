"""GPU memory sizes the planner knows by name, and how much of it a training process can actually use."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_gib: float
    """Per device as the framework sees it; an MI250 card is two GCDs, each its own 64 GiB device."""
    arch: str


GPUS: dict[str, GpuSpec] = {
    "mi300x": GpuSpec("AMD Instinct MI300X", 192, "gfx942"),
    "mi250": GpuSpec("AMD Instinct MI250 (one GCD)", 64, "gfx90a"),
    "h100": GpuSpec("NVIDIA H100 80GB", 80, "sm_90"),
    "h200": GpuSpec("NVIDIA H200", 141, "sm_90"),
}

# Not available to tensors: the runtime context, RCCL/NCCL buffers and kernels (about 1 GiB) and
# caching-allocator fragmentation (a few percent on long runs). An assumption, stated in docs/planning.md.
RUNTIME_RESERVE_BYTES = 1 * GIB
FRAGMENTATION_FRACTION = 0.05


def usable_bytes(memory_bytes: float) -> float:
    """What tensors can occupy on a device of ``memory_bytes``."""
    return memory_bytes * (1 - FRAGMENTATION_FRACTION) - RUNTIME_RESERVE_BYTES


def gpu_memory_bytes(gpu_type: str | None, memory_gib: float | None) -> tuple[float, str]:
    """Device memory in bytes and a label, from ``--gpu-memory`` (wins) or ``--gpu-type``."""
    if memory_gib is not None:
        if memory_gib <= 0:
            raise ValueError(f"--gpu-memory must be a positive number of GiB, got {memory_gib}")
        return memory_gib * GIB, f"{memory_gib:g} GiB per GPU"
    key = (gpu_type or "mi300x").lower()
    if key not in GPUS:
        raise ValueError(f"--gpu-type {gpu_type!r} is unknown; choose one of {', '.join(GPUS)} or give --gpu-memory")
    spec = GPUS[key]
    return spec.memory_gib * GIB, f"{spec.name}, {spec.memory_gib:g} GiB"

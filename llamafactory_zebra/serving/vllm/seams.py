"""Every vLLM function the serving plugin replaces, in one place, with the upstream source it was written against.

vLLM offers no hook for either fix below, so :func:`install` (called by ``register()`` in every vLLM
process) wraps the upstream functions. ``VLLM_SEAMS`` records the SHA-256 of each wrapped function's
source as read in vLLM 0.32; ``tests_vllm/test_vllm_seams.py`` fails when an upgrade changes any of them,
so a changed upstream is re-read before the wrapper is trusted again.

1. LoRA rows without an adapter (CPU). vLLM's CPU LoRA ops (``vllm/lora/ops/torch_ops/lora_ops.py``)
   select each token's adapter with ``stack[index]``; a request without an adapter has index -1, which
   PyTorch reads as the *last* adapter slot, so on a LoRA-enabled CPU server base-model requests were
   served with another request's adapter (and every decode step applies it, even with no adapter in the
   batch). :func:`_shrink_without_adapter_rows` zeroes the rank-``r`` activations of those rows after
   vLLM's shrink; the expand step then adds ``0 @ B = 0``. Zebra declares no LoRA embedding modules, so
   every LoRA path on its layers starts with this shrink. vLLM's GPU kernels skip index -1 themselves.
2. Unservable adapters (``lora.py``): ``WorkerLoRAManager._load_adapter`` is wrapped so that an adapter
   vLLM refuses for a Zebra model is named with its directory, the reason and the fix.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
from collections.abc import Callable

import torch

# (module, attribute path, SHA-256 of the upstream source in vLLM 0.32). The first three are what fix 1
# relies on: the shrink op, the prefill op that calls it by its module-global name, and the CPU wrapper
# that calls it for decode steps and logits.
VLLM_SEAMS: tuple[tuple[str, str, str], ...] = (
    (
        "vllm.lora.ops.torch_ops.lora_ops",
        "bgmv_shrink",
        "e7a5eafed74a2bc1b505dd46bfba7fefff868ac36985a5a5bc9ab1fda2f713e1",
    ),
    (
        "vllm.lora.ops.torch_ops.lora_ops",
        "sgmv_shrink",
        "1f116c7327f60a71ef43b66a326c6307adba5ede84f8a74ba1fa291ca4ccc090",
    ),
    (
        "vllm.lora.punica_wrapper.punica_cpu",
        "PunicaWrapperCPU",
        "acc9bc9cf24eb2dbbcd0e4e2d3e01b007e3fafba3cf16fc2eba0571070afc30a",
    ),
    (
        "vllm.lora.worker_manager",
        "WorkerLoRAManager._load_adapter",
        "e05648e184ddc4f7653516d774688af9e5864a851ea6ec34c49a93a39a942126",
    ),
)

# The upstream objects as they were before install(), for the drift test and the wrappers.
ORIGINALS: dict[tuple[str, str], Callable] = {}


def upstream(module_name: str, attribute: str) -> Callable:
    """The upstream object, unwrapped even after :func:`install`."""
    if (module_name, attribute) in ORIGINALS:
        return ORIGINALS[(module_name, attribute)]
    owner = importlib.import_module(module_name)
    for part in attribute.split("."):
        owner = getattr(owner, part)
    return owner


def source_hash(obj: Callable) -> str:
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()


def _shrink_without_adapter_rows(shrink: Callable) -> Callable:
    """vLLM's ``bgmv_shrink``, then zero in the output every row whose adapter index is negative (no adapter)."""

    @functools.wraps(shrink)
    def zebra_bgmv_shrink(
        inputs: torch.Tensor,
        lora_weights: torch.Tensor,
        output_tensor: torch.Tensor,
        lora_indices_tensor: torch.Tensor,
        scaling: float = 1.0,
    ) -> None:
        shrink(inputs, lora_weights, output_tensor, lora_indices_tensor, scaling)
        without_adapter = lora_indices_tensor < 0
        if without_adapter.any():
            output_tensor[: len(lora_indices_tensor)][without_adapter] = 0

    return zebra_bgmv_shrink


def install() -> None:
    """Apply both fixes (idempotent: each process's plugin load calls it once or more)."""
    from .lora import load_adapter_naming_the_fix

    lora_ops = importlib.import_module("vllm.lora.ops.torch_ops.lora_ops")
    punica_cpu = importlib.import_module("vllm.lora.punica_wrapper.punica_cpu")
    worker_manager = importlib.import_module("vllm.lora.worker_manager")
    if ("vllm.lora.ops.torch_ops.lora_ops", "bgmv_shrink") in ORIGINALS:
        return
    ORIGINALS[("vllm.lora.ops.torch_ops.lora_ops", "bgmv_shrink")] = lora_ops.bgmv_shrink
    load_adapter = worker_manager.WorkerLoRAManager._load_adapter
    ORIGINALS[("vllm.lora.worker_manager", "WorkerLoRAManager._load_adapter")] = load_adapter

    fixed_shrink = _shrink_without_adapter_rows(lora_ops.bgmv_shrink)
    lora_ops.bgmv_shrink = fixed_shrink  # sgmv_shrink (prompt chunks) calls it by this module-global name
    punica_cpu.bgmv_shrink = fixed_shrink  # PunicaWrapperCPU's decode steps and logits call it by this one
    worker_manager.WorkerLoRAManager._load_adapter = load_adapter_naming_the_fix(load_adapter)

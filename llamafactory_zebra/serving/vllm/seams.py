"""Every vLLM function the serving plugin replaces, in one place, with the upstream source it was written against.

vLLM offers no hook for any fix below, so :func:`install` (called by ``register()`` in every vLLM
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
3. Prompt chunks cut at a stale block size (CPU, prefix caching on). In ``align`` mode the scheduler ends
   prompt chunks where the GDN states are cached, reading ``cache_config.block_size``. The engine core
   sets it to the KV cache's block size (1,664 tokens for the released head shapes in bf16), but after
   the front-end handshake it re-runs ``VllmConfig.__post_init__``, and the CPU platform's
   ``check_and_update_config`` resets a block size the user did not pass to its default, 128. Every
   prompt was then cut at its last multiple of 128 (a 256-token prompt ran as two 128-token chunks, each
   a pass over its GDN states) while states are cached only at 1,664-token borders: same answers, more
   work, and 11-12% of the serving benchmark's throughput. :func:`_split_at_the_mamba_block_size` puts
   the block size of the KV cache's Mamba groups back before vLLM's split runs, for Zebra models only.
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
    # Fix 3: the split that reads the block size, and the platform hook that resets it.
    (
        "vllm.v1.core.sched.scheduler",
        "Scheduler._mamba_block_aligned_split",
        "b2a08c774ae495bfdd509380e8d14ccdd0bd2c5b70219720a926059a0d8eb9b0",
    ),
    (
        "vllm.platforms.cpu",
        "CpuPlatform.check_and_update_config",
        "d2960ad5d183676793d6988a9a4ed50175d18dbf8baf70fc01f686d50887a0df",
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


def mamba_block_size(kv_cache_config) -> int | None:
    """The block size of the KV cache's Mamba groups (where align mode caches GDN states), or None."""
    from vllm.v1.kv_cache_interface import MambaSpec

    sizes = {
        g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups if isinstance(g.kv_cache_spec, MambaSpec)
    }
    return sizes.pop() if len(sizes) == 1 else None


def _split_at_the_mamba_block_size(split: Callable) -> Callable:
    """vLLM's ``Scheduler._mamba_block_aligned_split``, after restoring ``cache_config.block_size`` to the
    Mamba groups' block size for a Zebra model (fix 3 in the module docstring)."""
    from .config_parser import ARCHITECTURE

    @functools.wraps(split)
    def zebra_mamba_block_aligned_split(self, *args, **kwargs) -> int:
        if self.vllm_config.model_config.architecture == ARCHITECTURE:
            block_size = mamba_block_size(self.kv_cache_config)
            if block_size is not None and self.cache_config.block_size != block_size:
                self.cache_config.block_size = block_size
        return split(self, *args, **kwargs)

    return zebra_mamba_block_aligned_split


def install() -> None:
    """Apply the fixes (idempotent: each process's plugin load calls it once or more)."""
    from vllm.v1.core.sched.scheduler import Scheduler

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
    split = Scheduler._mamba_block_aligned_split
    ORIGINALS[("vllm.v1.core.sched.scheduler", "Scheduler._mamba_block_aligned_split")] = split
    Scheduler._mamba_block_aligned_split = _split_at_the_mamba_block_size(split)

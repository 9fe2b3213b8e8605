"""Which PyTorch formulation of the chunked gated delta rule runs when fla does not.

Two exact formulations share fla's contract. ``chunk.py`` is tuned for CPU threads (in-place state
updates, a hand-written backward) and stays the CPU choice: on CPU it trains faster than
``chunk_parallel.py``, which does about twice its FLOPs (measured by
``benchmarks/bench_gdn_torch_paths.py``, figures in ``docs/benchmarks.md``). ``chunk_parallel.py`` is shaped for GPUs (a fixed number of whole-chunk batched ops, one GEMM per chunk
step) and is the choice for CUDA/ROCm tensors. ``ZEBRA_GDN_TORCH_CHUNK`` overrides the choice:
``auto`` (default, by device), ``chunk``, ``parallel`` or ``parallel-compiled`` (the parallel path with
its whole-chunk parts under ``torch.compile``; opt-in, as compiling costs tens of seconds per process).
This is the one place the choice is made; it reads the variable at each call, so tests can set it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch

from .chunk import chunk_gated_delta_rule_torch
from .chunk_parallel import chunk_gated_delta_rule_parallel

TORCH_CHUNK_ENV_VAR = "ZEBRA_GDN_TORCH_CHUNK"
TORCH_CHUNK_CHOICES = {
    "chunk": chunk_gated_delta_rule_torch,
    "parallel": chunk_gated_delta_rule_parallel,
    "parallel-compiled": functools.partial(chunk_gated_delta_rule_parallel, compile=True),
}


def torch_chunk_function(tensor: torch.Tensor) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
    """The PyTorch chunked gated-delta-rule function for inputs like ``tensor`` (see the module docstring)."""
    choice = os.environ.get(TORCH_CHUNK_ENV_VAR, "auto").strip().lower() or "auto"
    if choice == "auto":
        choice = "parallel" if tensor.is_cuda else "chunk"  # ROCm builds report their GPUs as cuda too
    if choice not in TORCH_CHUNK_CHOICES:
        raise ValueError(
            f"{TORCH_CHUNK_ENV_VAR}={choice!r} is not valid; use one of auto, {', '.join(TORCH_CHUNK_CHOICES)}."
        )
    return TORCH_CHUNK_CHOICES[choice]

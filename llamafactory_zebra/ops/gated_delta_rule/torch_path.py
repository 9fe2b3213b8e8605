"""Which PyTorch formulation of the chunked gated delta rule runs when fla does not.

Two exact formulations share fla's contract: ``chunk.py`` (tuned for CPU threads: in-place state updates, a
hand-written backward) and ``chunk_parallel.py`` (shaped for GPUs: a fixed number of whole-chunk batched ops,
one GEMM per chunk step). The rule that picks one by device and ``ZEBRA_GDN_TORCH_CHUNK`` lives with the
other kernel switches (``kernels/switches.py``), so ``llamafactory-zebra doctor`` reports the same choice;
this module maps the chosen name to its function. Measured costs: ``benchmarks/bench_gdn_torch_paths.py``,
figures in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ...kernels.switches import TORCH_CHUNK_ENV_VAR, torch_chunk_choice
from .chunk import chunk_gated_delta_rule_torch
from .chunk_parallel import chunk_gated_delta_rule_parallel

__all__ = ["TORCH_CHUNK_ENV_VAR", "torch_chunk_function"]

_FUNCTIONS = {
    "chunk": chunk_gated_delta_rule_torch,
    "parallel": chunk_gated_delta_rule_parallel,
    "parallel-compiled": functools.partial(chunk_gated_delta_rule_parallel, compile=True),
}


def torch_chunk_function(tensor: torch.Tensor) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
    """The PyTorch chunked gated-delta-rule function for inputs like ``tensor`` (ROCm builds report their
    GPUs as ``cuda`` too)."""
    return _FUNCTIONS[torch_chunk_choice(tensor.is_cuda)]

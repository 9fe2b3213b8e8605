"""The GDN decode step on fp32 or bf16 state slots, in C++ (``cpu_step.cpp``): the wrapper the op's table maps
its ``cpp`` entry to (``gated_delta_rule/in_slots.py``).

Why a kernel of our own: vLLM's CPU GDN kernel refuses Zebra's head sizes (key 256, value 512), and the
PyTorch step (``in_slots.py::_step_in_place``) is bound by how BLAS runs its two state products: a ``bmm``
with two rows per head packs the whole state first, so it moves the 3 MB a sequence several times at a
third of this machine's read bandwidth, and a decode step is mostly that. ``cpu_step.cpp`` reads each
head's state once for both products and updates it while it is still in cache (speed:
``benchmarks/bench_vllm_gdn_cpu.py``, figures in ``docs/benchmarks.md``).
"""

from __future__ import annotations

import torch

from .build import cpu_kernels


def cpu_step_in_slots(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    scale: float,
    use_qk_l2norm_in_kernel: bool,
) -> torch.Tensor:
    """Advance ``state[state_indices[i]]`` by token i in place and return ``o`` ``[N, H, V]`` in q's dtype.

    The arguments are those of the op's PyTorch step (``in_slots.py::_step_torch``), where the registry chose
    this kernel (bf16 or fp32 CPU inputs on an fp32 or bf16 state with rows of V contiguous); the kernel
    normalises and scales q and k and takes exp(g) itself."""
    return cpu_kernels().gated_delta_step_in_slots(
        state,
        state_indices.to(torch.int64).contiguous(),
        q.contiguous(),
        k.contiguous(),
        v.to(q.dtype).contiguous(),
        g.float().contiguous(),
        beta.float().contiguous(),
        scale,
        use_qk_l2norm_in_kernel,
    )

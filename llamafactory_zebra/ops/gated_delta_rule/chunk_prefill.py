"""The chunked gated delta rule for serving prefills: no backward, states read from and written to slots.

Why apart from ``chunk.py``'s op: that one serves training, so it keeps every operand in fp32 for its
backward pass. A prefill keeps nothing, and on a CPU with bf16 dot products it feeds its GEMMs bf16
operands as fla's Triton kernels feed theirs on a GPU (``matmul_dtype``): q and k are L2-normalised in fp32
and rounded to bf16 once (fla's ``l2norm`` writes its input dtype), the operands are scaled (beta, the
decays, the softmax scale) in bf16, and the state, the Gram matrices K K^T and Q K^T (fp32 products of
the bf16 values, as fla accumulates them) and the triangular solve stay fp32. CPU GEMMs
have no bf16-in/fp32-out form, so each bf16 product is rounded to bf16 once more (fla keeps its
accumulator in fp32). With ``matmul_dtype`` left at the compute dtype it is the exact path, ``chunk.py``'s
forward. The algebra and its notation are ``chunk.py``'s, whose pieces it calls.

On a CPU, bf16 and fp32 inputs on an fp32 state run ``cpu_prefill.cpp`` (the package's C++ CPU kernels,
``ops/cpu/``): the same algebra one (sequence, head) at a time, its four GEMMs per chunk through
ATen and everything between them fused into loops over one chunk of one head, which stay in cache. Written
in PyTorch the op makes a dozen passes over every chunk and allocates as many prompt-sized temporaries per
call. The PyTorch code below is the reference it is tested against and the path everywhere else (fp64, a
bf16 state, no compiler, ``ZEBRA_CPU_KERNELS=torch``); its layout choices save passes too: q, k and v are
chunked in the operand dtype, K K^T and Q K^T come from one GEMM of ``[K; Q]`` with K^T, and W and U from
one GEMM of T with ``[diag(beta exp(gamma)) K | diag(beta) V]``. Sequences start from their slots' states
(zeros where ``has_initial_state`` is false) and their final states are written back into the slots. Speed:
``benchmarks/bench_vllm_gdn_cpu.py``, figures in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import torch

from ..segments import segment_bounds
from .checks import compute_dtype, l2norm
from .chunk import CHUNK_SIZE, _bmm, chunk_decays, chunk_recurrence, wy_inverse
from .chunk_plan import make_chunk_plan


@torch.no_grad()
def chunk_gated_delta_rule_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor,
    scale: float | None = None,
    *,
    use_qk_l2norm_in_kernel: bool = False,
    matmul_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Segment ``i`` of the packed ``[1, T, H, *]`` inputs from slot ``state_indices[i]``; returns ``o``
    ``[1, T, H, V]`` in q's dtype and writes each final state into its slot (the PyTorch path).

    The arguments are those of ``ops.chunk_gated_delta_rule_in_slots`` (which checks them), plus
    ``matmul_dtype``: ``None`` (the compute dtype: exact) or ``torch.bfloat16`` (bf16 GEMM operands).
    """
    dtype = compute_dtype(q.dtype)
    operand = dtype if matmul_dtype is None else matmul_dtype
    if operand not in (dtype, torch.bfloat16):
        raise ValueError(f"matmul_dtype must be None or torch.bfloat16, got {matmul_dtype}.")
    _, seq_len, heads, key_dim = q.shape
    scale = key_dim**-0.5 if scale is None else float(scale)
    starts, lengths = segment_bounds(1, seq_len, cu_seqlens)
    plan = make_chunk_plan(starts, lengths, CHUNK_SIZE, q.device)
    size = plan.chunk_size

    qf, kf = q[0].to(dtype), k[0].to(dtype)
    if use_qk_l2norm_in_kernel:
        qf, kf = l2norm(qf), l2norm(kf)
    qc, kc, vc = plan.to_chunks(qf.to(operand)), plan.to_chunks(kf.to(operand)), plan.to_chunks(v[0].to(operand))
    bc = plan.to_chunks(beta[0, ..., None].to(dtype))[..., 0]
    gamma = plan.to_chunks(g[0, ..., None].to(dtype))[..., 0].cumsum(-1)
    exp_gamma, exp_last, exp_tail, decay = chunk_decays(gamma)

    keys = kc.to(dtype)
    grams = _bmm(torch.cat([keys, qc.to(dtype)], dim=2), keys.mT)  # rows [:C] K K^T, rows [C:] Q K^T
    inv = wy_inverse(grams[:, :, :size], decay, bc)
    written = torch.cat([kc * (bc * exp_gamma)[..., None].to(operand), vc * bc[..., None].to(operand)], dim=-1)
    wu = _bmm(inv.to(operand), written)
    qw = torch.cat([qc * (scale * exp_gamma)[..., None].to(operand), wu[..., :key_dim]], dim=2)
    u = wu[..., key_dim:]
    intra = (grams[:, :, size:] * decay).mul_(scale).to(operand)
    kd = (kc * exp_tail[..., None].to(operand)).mT.contiguous()

    slots = state_indices.to(device=q.device, dtype=torch.long)[plan.order]
    current = torch.zeros(len(slots), heads, key_dim, v.shape[-1], dtype=dtype, device=q.device)
    continuing = has_initial_state.to(q.device)[plan.order]
    if bool(continuing.any()):
        current[continuing] = state[slots[continuing]].to(dtype)
    products = chunk_recurrence(qw, u, kd, exp_last, current, plan)
    o = _bmm(intra, products[:, :, size:]).add_(products[:, :, :size])
    state[slots] = current.to(state.dtype)
    return plan.from_chunks(o)[None].to(q.dtype)

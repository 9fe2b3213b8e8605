"""Chunked gated delta rule as whole-chunk tensor work plus one GEMM per chunk step: the GPU-shaped PyTorch path.

Why this exists next to ``chunk.py``: that op is tuned for CPU threads (in-place state updates, a
hand-written backward, a step loop whose width shrinks as packed sequences end). On a GPU each of its
chunk steps is several small kernels forward and more backward, and its Python step loop carries the
whole V-sized update. Here the chunk-to-chunk recurrence is first turned into an affine map per chunk,
computed for every chunk at once, so the only sequential part is one ``baddbmm`` per chunk step::

    S_{c+1} = M_c S_c + B_c,   M_c = exp(gamma_C) I - Kd^T W,   B_c = Kd^T U

with, per chunk of C tokens (gamma = in-chunk cumsum of g, Gamma_ij = exp(gamma_i - gamma_j) for
j <= i, q already scaled; the WY/UT form of fla's ``ops/gated_delta_rule/chunk.py``, as in ``chunk.py``)::

    T  = (I + strictly_lower(diag(beta) (K K^T * Gamma)))^-1
    W  = T diag(beta exp(gamma)) K      U = T diag(beta) V      Kd = diag(exp(gamma_C - gamma)) K
    O  = diag(exp(gamma)) Q S_c + lower(Q K^T * Gamma) (U - W S_c)

Everything but the step loop (the decays, Gram matrices, the batched triangular solve, M, B and the
outputs from the kept states) runs on a static ``[chunks, H, C, D]`` layout in a fixed number of
batched ops, so ``torch.compile`` can fuse it and its op count does not grow with length or segment
count. The step loop has static shapes too: every packed segment takes part in every step (a segment
that has run out of chunks steps through the identity map), so the step is one shape for the whole
call. Autograd differentiates the batched parts; the step loop has its own backward, two GEMMs a step.
The price is FLOPs in the loop (K x K x V per chunk instead of 2 C x K x V: 2x at Zebra's K = 256,
C = 64) and a ``[K, K]`` matrix per chunk kept for the backward; the bet (unmeasured: no GPU here) is
that a GPU's loop is bound by kernel launches, not by these FLOPs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ..segments import segment_bounds
from .checks import check_gdn_inputs, compute_dtype, l2norm
from .chunk_plan import ChunkPlan, make_chunk_plan

CHUNK_SIZE = 64


def chunk_transitions(
    qc: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, gc: torch.Tensor, bc: torch.Tensor, scale: float
) -> tuple[torch.Tensor, ...]:
    """Per-chunk quantities of all chunks at once from ``[chunks, H, C, D]`` (``gc``, ``bc``: ``[chunks, H, C]``).

    Returns ``(M, B, Q exp(gamma) scale, W, U, in-chunk attention)``; M is ``[chunks, H, K, K]``, B is
    ``[chunks, H, K, V]``.
    """
    size = qc.shape[-2]
    gamma = gc.cumsum(-1)
    above = torch.ones(size, size, dtype=torch.bool, device=qc.device).triu(1)
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(above, float("-inf")).exp()
    strict = ((kc @ kc.mT) * decay * bc[..., None]).tril(-1)
    eye = torch.eye(size, dtype=qc.dtype, device=qc.device)
    inverse = torch.linalg.solve_triangular(strict + eye, eye.expand_as(strict), upper=False, unitriangular=True)
    exp_gamma = gamma.exp()
    w = inverse @ (kc * (bc * exp_gamma)[..., None])
    u = inverse @ (vc * bc[..., None])
    kd = kc * (gamma[..., -1:] - gamma).exp()[..., None]
    transition = gamma[..., -1, None, None].exp() * torch.eye(kc.shape[-1], dtype=qc.dtype, device=qc.device)
    transition = transition - kd.mT @ w
    offset = kd.mT @ u
    q_decayed = qc * (scale * exp_gamma)[..., None]
    attention = (qc @ kc.mT) * decay * scale
    return transition, offset, q_decayed, w, u, attention


def chunk_outputs(
    states: torch.Tensor, q_decayed: torch.Tensor, w: torch.Tensor, u: torch.Tensor, attention: torch.Tensor
) -> torch.Tensor:
    """``O = Q_decayed S + A (U - W S)`` for every chunk, from the state entering it (``[chunks, H, K, V]``).

    Q_decayed and W are stacked so that each state is read by one GEMM for both products.
    """
    size = q_decayed.shape[-2]
    products = torch.cat([q_decayed, w], dim=-2) @ states
    return products[..., :size, :] + attention @ (u - products[..., size:, :])


@functools.cache
def _compiled(function: Callable) -> Callable:
    """``torch.compile`` once per function; chunk counts vary per call, so shapes are marked dynamic."""
    return torch.compile(function, dynamic=True)


def step_layout(plan: ChunkPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each chunk sits in the static step loop, built on the host once per call (no device sync).

    Returns ``layout`` ``[steps, N]``, the chunk id advanced by each sorted sequence at each step
    (``plan.num_chunks``, the identity map, once that sequence is done), and ``position``
    ``[num_chunks]``, the flat ``steps * N`` index at which each chunk is entered.
    """
    num_seqs = len(plan.order)
    firsts = torch.tensor([first for first, _ in plan.steps], dtype=torch.int64)
    actives = torch.tensor([active for _, active in plan.steps], dtype=torch.int64)
    ranks = torch.arange(num_seqs)
    layout = torch.where(ranks < actives[:, None], firsts[:, None] + ranks, plan.num_chunks)
    real = layout.flatten() < plan.num_chunks
    position = torch.empty(plan.num_chunks, dtype=torch.int64)
    position[layout.flatten()[real]] = torch.nonzero(real).flatten()
    device = plan.order.device
    return layout.to(device), position.to(device)


class _AffineStateSteps(torch.autograd.Function):
    """``S_{j+1} = M_j S_j + B_j`` for every step j: one ``baddbmm`` a step forward, two backward.

    Why not autograd through a Python loop: each step would be an autograd node whose saved and
    gradient tensors are fresh allocations, and the states would be copied once more to stack them.
    Here the states are written into one preallocated tensor (which is also what the outputs need)
    and the backward runs the reverse recurrence into preallocated gradients::

        dB_j = dS_{j+1}     dM_j = dS_{j+1} S_j^T     dS_j = dStates_j + M_j^T dS_{j+1}
    """

    @staticmethod
    def forward(ctx, transition, offset, state):
        states = offset.new_empty(len(offset) + 1, *offset.shape[1:])
        states[0].copy_(state)
        for step in range(len(offset)):
            torch.baddbmm(offset[step], transition[step], states[step], out=states[step + 1])
        ctx.save_for_backward(transition, states)
        return states

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_states):
        transition, states = ctx.saved_tensors
        steps = len(transition)
        grad_offset = torch.empty_like(states[1:])
        grad_transition = torch.empty_like(transition)
        grad_initial = torch.empty_like(states[0])
        leaving = grad_offset[steps - 1].copy_(grad_states[steps]) if steps else grad_initial.copy_(grad_states[0])
        for step in reversed(range(steps)):
            torch.bmm(leaving, states[step].mT, out=grad_transition[step])
            entering = grad_offset[step - 1] if step else grad_initial
            leaving = torch.baddbmm(grad_states[step], transition[step].mT, leaving, out=entering)
        return grad_transition, grad_offset, grad_initial


def chunk_gated_delta_rule_parallel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    *,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    compile: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The GPU-shaped PyTorch path of :func:`~llamafactory_zebra.ops.chunk_gated_delta_rule` (same contract).

    Computed in fp32 (fp64 for fp64 inputs), differentiable. ``compile=True`` runs the
    whole-chunk parts through ``torch.compile`` (the step loop stays eager: one ``baddbmm`` a step).
    """
    check_gdn_inputs(q, k, v, g, beta, initial_state, cu_seqlens)
    batch, seq_len, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    dtype = compute_dtype(q.dtype)
    scale = key_dim**-0.5 if scale is None else float(scale)
    starts, lengths = segment_bounds(batch, seq_len, cu_seqlens)
    plan = make_chunk_plan(starts, lengths, CHUNK_SIZE, q.device)
    num_seqs = len(plan.order)

    with torch.autocast(q.device.type, enabled=False):  # fp32 maths even under a bf16 autocast
        qf, kf, vf, gf, bf = (t.flatten(0, 1).to(dtype) for t in (q, k, v, g, beta))
        if use_qk_l2norm_in_kernel:
            qf, kf = l2norm(qf), l2norm(kf)
        chunks = [plan.to_chunks(t) for t in (qf, kf, vf)]
        chunks += [plan.to_chunks(t[..., None])[..., 0] for t in (gf, bf)]
        prepare, finish = chunk_transitions, chunk_outputs
        if compile:
            prepare, finish = _compiled(prepare), _compiled(finish)
        transition, offset, q_decayed, w, u, attention = prepare(*chunks, scale)

        layout, position = step_layout(plan)
        steps = len(layout)
        if layout.numel() == plan.num_chunks:
            # Every sequence has a chunk at every step (one row, or equal lengths): chunk ``j * N + r`` is
            # already step j's entry r, so the maps are used in place, without a gathered copy.
            step_transition = transition.view(steps, num_seqs * heads, key_dim, key_dim)
            step_offset = offset.view(steps, num_seqs * heads, key_dim, value_dim)
        else:  # sequences that are done step through an identity map, appended as chunk id ``num_chunks``
            identity = torch.eye(key_dim, dtype=dtype, device=q.device).expand(1, heads, key_dim, key_dim)
            step_transition = torch.cat([transition, identity])[layout].flatten(1, 2)
            step_offset = torch.cat([offset, offset.new_zeros(1, heads, key_dim, value_dim)])[layout].flatten(1, 2)
        if initial_state is None:
            state = q.new_zeros(num_seqs * heads, key_dim, value_dim, dtype=dtype)
        else:
            state = initial_state.to(dtype)[plan.order].flatten(0, 1)
        states = _AffineStateSteps.apply(step_transition, step_offset, state)

        entered = states.view(-1, heads, key_dim, value_dim)  # the state entering each chunk
        entered = entered[: plan.num_chunks] if layout.numel() == plan.num_chunks else entered[position]
        o = finish(entered, q_decayed, w, u, attention)
    o = plan.from_chunks(o).view(batch, seq_len, heads, value_dim).to(q.dtype)
    if not output_final_state:
        return o, None
    last = states[-1].view(num_seqs, heads, key_dim, value_dim)
    final = torch.empty_like(last).index_copy(0, plan.order, last) if not plan.in_order else last
    return o, final

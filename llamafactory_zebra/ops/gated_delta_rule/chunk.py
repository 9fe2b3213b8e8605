"""Chunked gated delta rule in plain PyTorch, with a hand-written backward.

Why this exists: fla's Triton kernels need a GPU, and transformers' Qwen3-Next fallback
(``torch_chunk_gated_delta_rule``) is differentiated by autograd through per-chunk slicing and a 63-step row loop,
whose backward costs O(chunks x T) (measured against this file in ``docs/benchmarks.md``). This version follows the
WY/UT formulation of fla's ``ops/gated_delta_rule/chunk.py`` (Yang, Kautz, Hatamizadeh, "Gated Delta Networks", 2024;
fla is MIT-licensed, Copyright (c) 2023-2025 Songlin Yang, Yu Zhang), written for batched dense algebra: every in-chunk
quantity is computed for all chunks at once, the triangular system by one batched ``solve_triangular``, and only the
chunk-to-chunk state recurrence is a Python loop, forward and backward (see ``chunk_plan.py`` for how varlen sequences
share that loop).

Per chunk of C tokens (gamma = in-chunk cumsum of g, Gamma_ij = exp(gamma_i - gamma_j) for j <= i,
state S0 entering the chunk, q already scaled)::

    T  = (I + strictly_lower(diag(beta) (K K^T * Gamma)))^-1
    W  = T diag(beta exp(gamma)) K          U = T diag(beta) V
    Vn = U - W S0                           (the "new values" the chunk writes)
    O  = diag(exp(gamma)) Q S0 + lower(Q K^T * Gamma) Vn
    S1 = exp(gamma_C) S0 + (diag(exp(gamma_C - gamma)) K)^T Vn

Only non-positive exponents appear, so nothing overflows for g <= 0. All maths runs in fp32 (fp64
for fp64 inputs). When gradients are needed, the state entering every chunk is kept for the backward
pass (N_chunks x H x K x V floats, 400 MB for the Zebra layer at T = 8k), with the chunked inputs; the
backward recomputes every other in-chunk quantity from them. ``chunk_prefill.py`` runs the
same forward for serving prefills, with the pieces below (:func:`chunk_decays`, :func:`wy_inverse`,
:func:`chunk_recurrence`).
"""

from __future__ import annotations

import torch

from ..segments import segment_bounds
from .checks import check_gdn_inputs, compute_dtype, l2norm
from .chunk_plan import ChunkPlan, make_chunk_plan

CHUNK_SIZE = 64


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched matmul over the leading ``[chunks, heads]`` dimensions of two 4-D tensors."""
    return torch.bmm(a.flatten(0, 1), b.flatten(0, 1)).view(*a.shape[:2], a.shape[2], b.shape[3])


def chunk_decays(gamma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the in-chunk cumulative log-decays ``gamma`` ``[..., C]``: exp(gamma), exp(gamma_C) (the whole
    chunk's decay), exp(gamma_C - gamma) (a token's decay to the chunk's end) and the ``[..., C, C]`` matrix
    Gamma_ij = exp(gamma_i - gamma_j) for j <= i, zero above the diagonal."""
    size = gamma.shape[-1]
    exp_gamma = gamma.exp()
    exp_last = exp_gamma[..., -1].contiguous()
    exp_tail = (gamma[..., -1:] - gamma).exp()
    above = torch.ones(size, size, dtype=torch.bool, device=gamma.device).triu(1)
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill_(above, float("-inf")).exp_()
    return exp_gamma, exp_last, exp_tail, decay


def wy_inverse(kk: torch.Tensor, decay: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """T = (I + strictly_lower(diag(beta) (K K^T * Gamma)))^-1 per chunk, from the Gram matrix ``kk``."""
    strict = (kk * decay).mul_(beta[..., None]).tril_(-1)
    eye = torch.eye(kk.shape[-1], dtype=kk.dtype, device=kk.device).expand_as(strict)
    return torch.linalg.solve_triangular(strict, eye, upper=False, unitriangular=True)


def chunk_recurrence(
    qw: torch.Tensor,
    u: torch.Tensor,
    kd: torch.Tensor,
    exp_last: torch.Tensor,
    state: torch.Tensor,
    plan: ChunkPlan,
    states: torch.Tensor | None = None,
) -> torch.Tensor:
    """The chunk-to-chunk loop: advance ``state`` ``[N, H, K, V]`` (sequences in plan order) in place.

    ``qw`` ``[chunks, H, 2C, K]`` holds scale * exp(gamma) Q in rows ``[:C]`` and W in rows ``[C:]``, so one
    GEMM with the entering state S0 gives both products; ``u`` is U and ``kd`` the keys decayed to the chunk's
    end, transposed (``[chunks, H, K, C]``). The GEMM operands take ``qw``'s dtype (the state is cast to it);
    a product of a narrower dtype than the state is rounded once and added (CPUs have no bf16-in/fp32-out
    GEMM). Returns ``[chunks, H, 2C, V]``: rows ``[:C]`` the inter-chunk output diag(exp(gamma)) Q S0 (scaled),
    rows ``[C:]`` the new values Vn = U - W S0. ``states``, when given, receives the state entering each chunk.
    """
    size = plan.chunk_size
    products = u.new_empty(*qw.shape[:3], u.shape[-1])
    vn = products[:, :, size:]
    for first, active in plan.steps:
        chunk = slice(first, first + active)
        current = state[:active]
        if states is not None:
            states[chunk].copy_(current)
        torch.bmm(qw[chunk].flatten(0, 1), current.to(qw.dtype).flatten(0, 1), out=products[chunk].flatten(0, 1))
        torch.sub(u[chunk], vn[chunk], out=vn[chunk])
        current.mul_(exp_last[chunk][..., None, None])
        written = (kd[chunk].flatten(0, 1), vn[chunk].flatten(0, 1))
        if qw.dtype == current.dtype:
            current.flatten(0, 1).baddbmm_(*written)
        else:
            current.flatten(0, 1).add_(torch.bmm(*written).to(current.dtype))
    return products


def _chunk_intermediates(qc, kc, vc, bc, gamma, scale: float) -> dict[str, torch.Tensor]:
    """The in-chunk quantities of the module docstring, from the chunked inputs and ``gamma``: computed by the
    forward, and again by the backward (which keeps only the inputs and the entering states, as fla's chunk
    kernels recompute in backward what they do not save), by the same operations, so to the same values."""
    exp_gamma, exp_last, exp_tail, decay = chunk_decays(gamma)
    kk = _bmm(kc, kc.mT)
    inv = wy_inverse(kk, decay, bc)
    qw = torch.cat([qc * (scale * exp_gamma)[..., None], _bmm(inv, kc * (bc * exp_gamma)[..., None])], dim=2)
    u = _bmm(inv, vc * bc[..., None])
    qk = _bmm(qc, kc.mT).mul_(scale)
    intra = qk * decay
    kd = kc * exp_tail[..., None]
    return {
        "exp_gamma": exp_gamma, "exp_last": exp_last, "exp_tail": exp_tail, "decay": decay, "kk": kk, "inv": inv,
        "qw": qw, "u": u, "qk": qk, "intra": intra, "kd": kd,
    }  # fmt: skip


class _ChunkGatedDeltaRuleFunction(torch.autograd.Function):
    """Saves the chunked inputs and the state entering each chunk (``4 + 2 + 1`` floats per token and head
    for K = V, plus ``K x V`` per chunk and head); the backward recomputes the rest
    (:func:`_chunk_intermediates`, and Vn = U - W S0 from the saved states in one batched GEMM), instead of
    keeping the ~12 chunk-sized intermediates of every GDN layer alive from forward to backward."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, scale: float, plan: ChunkPlan, keep: bool):
        size = plan.chunk_size
        with torch.autocast(q.device.type, enabled=False):
            qc, kc, vc = plan.to_chunks(q), plan.to_chunks(k), plan.to_chunks(v)
            bc = plan.to_chunks(beta[..., None])[..., 0]
            gamma = plan.to_chunks(g[..., None])[..., 0].cumsum(-1)
            parts = _chunk_intermediates(qc, kc, vc, bc, gamma, scale)

            if initial_state is None:
                state = q.new_zeros(len(plan.order), q.shape[1], k.shape[-1], v.shape[-1])
            else:
                state = initial_state[plan.order]  # a gathered copy, advanced in place below
            # The state entering every chunk is kept only when a backward pass will need it (``keep``).
            states = q.new_empty(plan.num_chunks, *state.shape[1:]) if keep else None
            products = chunk_recurrence(
                parts["qw"], parts["u"], parts["kd"].mT, parts["exp_last"], state, plan, states
            )
            o = _bmm(parts["intra"], products[:, :, size:]).add_(products[:, :, :size])
            del parts, products
            if plan.in_order:
                final = state
            else:
                final = torch.empty_like(state)
                final[plan.order] = state

        if keep:
            ctx.save_for_backward(qc, kc, vc, bc, gamma, states)
        ctx.scale, ctx.plan, ctx.has_initial_state = scale, plan, initial_state is not None
        return plan.from_chunks(o), final

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_o, grad_final):
        qc, kc, vc, bc, gamma, states = ctx.saved_tensors
        plan: ChunkPlan = ctx.plan
        size, scale = plan.chunk_size, ctx.scale
        with torch.autocast(qc.device.type, enabled=False):
            parts = _chunk_intermediates(qc, kc, vc, bc, gamma, scale)
            exp_gamma, exp_last, exp_tail, decay = (parts[n] for n in ("exp_gamma", "exp_last", "exp_tail", "decay"))
            kk, qk, intra, inv, qw, kd = (parts[n] for n in ("kk", "qk", "intra", "inv", "qw", "kd"))
            # Vn = U - W S0, as chunk_recurrence computed it chunk by chunk (the same GEMM, in one batch).
            vn = torch.sub(parts["u"], _bmm(qw[:, :, size:], states.to(qw.dtype)))
            del parts
            # Rows [:C] hold dO, rows [C:] hold -dVn, matching the row blocks of qw.
            douts = vn.new_empty(*vn.shape[:2], 2 * size, vn.shape[-1])
            do, neg_dvn = douts[:, :, :size], douts[:, :, size:]
            do.copy_(plan.to_chunks(grad_o.to(qc.dtype)))
            torch.bmm(intra.mT.flatten(0, 1), do.flatten(0, 1), out=neg_dvn.flatten(0, 1))
            neg_dvn.neg_()
            dstate = grad_final.to(qc.dtype)[plan.order].contiguous()
            dkd = torch.empty_like(kd)
            dlast = torch.empty_like(exp_last)
            for first, active in reversed(plan.steps):
                chunk = slice(first, first + active)
                dleaving = dstate[:active]
                flat = dleaving.flatten(0, 1)
                neg_dvn[chunk].flatten(0, 1).baddbmm_(kd[chunk].flatten(0, 1), flat, alpha=-1)
                torch.bmm(vn[chunk].flatten(0, 1), flat.mT, out=dkd[chunk].flatten(0, 1))
                torch.bmm(
                    states[chunk].flatten(0, 1).flatten(1)[:, None, :],
                    flat.flatten(1)[:, :, None],
                    out=dlast[chunk].view(-1, 1, 1),
                )
                dleaving.mul_(exp_last[chunk][..., None, None])
                flat.baddbmm_(qw[chunk].flatten(0, 1).mT, douts[chunk].flatten(0, 1))
            dinitial = None
            if ctx.has_initial_state:
                dinitial = torch.empty_like(dstate)
                dinitial[plan.order] = dstate

            dqw = _bmm(douts, states.mT)
            dqg, dw = dqw[:, :, :size], dqw[:, :, size:]
            dvn = neg_dvn.neg()
            dintra = _bmm(do, vn.mT)

            # W = inv Xw, U = inv Xu, inv = (I + strict)^-1.
            xw = kc * (bc * exp_gamma)[..., None]
            xu = vc * bc[..., None]
            dxw = _bmm(inv.mT, dw)
            dxu = _bmm(inv.mT, dvn)
            dinv = _bmm(dw, xw.mT).add_(_bmm(dvn, xu.mT))
            dstrict = _bmm(_bmm(inv.mT, dinv), inv.mT).neg_().tril_(-1)

            # strict = beta_i (K K^T * decay) below the diagonal; intra = scale (Q K^T) * decay.
            dkk = dstrict * bc[..., None] * decay
            ddecay = (dstrict * bc[..., None]).mul_(kk).add_(dintra * qk).mul_(decay)
            dqk = (dintra * decay).mul_(scale)

            dqc = _bmm(dqk, kc).add_(dqg * (scale * exp_gamma)[..., None])
            dkc = _bmm(dqk.mT, qc).add_(_bmm(dkk + dkk.mT, kc))
            dkc.add_(dkd * exp_tail[..., None]).add_(dxw * (bc * exp_gamma)[..., None])
            dvc = dxu * bc[..., None]
            dbc = (dstrict * kk * decay).sum(-1) + (dxw * kc).sum(-1) * exp_gamma + (dxu * vc).sum(-1)

            # gamma enters through exp(gamma) (Q and W rows), exp(gamma_C - gamma), exp(gamma_C) and decay.
            tail_term = (dkd * kd).sum(-1)
            dgamma = (dqg * qw[:, :, :size]).sum(-1) + (dxw * xw).sum(-1) - tail_term
            dgamma[..., -1] += tail_term.sum(-1) + dlast * exp_last
            dgamma += ddecay.sum(-1) - ddecay.sum(-2)
            dgc = dgamma.flip(-1).cumsum(-1).flip(-1)

            grads = (
                plan.from_chunks(dqc),
                plan.from_chunks(dkc),
                plan.from_chunks(dvc),
                plan.from_chunks(dgc[..., None])[..., 0],
                plan.from_chunks(dbc[..., None])[..., 0],
            )
        return *grads, dinitial, None, None, None


def chunk_gated_delta_rule_torch(
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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The PyTorch path of :func:`~llamafactory_zebra.ops.chunk_gated_delta_rule` (same contract), exact
    (fp32, fp64 for fp64 inputs) and differentiable. Serving prefills on a CPU take ``chunk_prefill.py``."""
    check_gdn_inputs(q, k, v, g, beta, initial_state, cu_seqlens)
    batch, seq_len, heads, key_dim = q.shape
    dtype = compute_dtype(q.dtype)
    scale = key_dim**-0.5 if scale is None else float(scale)
    starts, lengths = segment_bounds(batch, seq_len, cu_seqlens)
    plan = make_chunk_plan(starts, lengths, CHUNK_SIZE, q.device)

    qf, kf, vf, gf, bf = (t.flatten(0, 1).to(dtype) for t in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        qf, kf = l2norm(qf), l2norm(kf)
    h0 = None if initial_state is None else initial_state.to(dtype)
    inputs = (qf, kf, vf, gf, bf, h0)
    keep = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)
    o, final = _ChunkGatedDeltaRuleFunction.apply(*inputs, scale, plan, keep)
    return o.view(batch, seq_len, heads, v.shape[-1]).to(q.dtype), final if output_final_state else None

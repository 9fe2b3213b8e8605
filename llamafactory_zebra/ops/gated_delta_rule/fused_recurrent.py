"""Token-by-token gated delta rule for decoding, in PyTorch.

Decoding feeds one (or a few) tokens per sequence and a cached state; the chunked form's set-up costs
more than it saves there. This steps every token like ``naive.py`` but advances all sequences of the
batch (or all ``cu_seqlens`` segments) together, using the same step plan as the chunked path with
chunk size 1. Plain autograd differentiates it (fla's fused recurrent kernel has no backward).
"""

from __future__ import annotations

import torch

from ..segments import segment_bounds
from .checks import check_gdn_inputs, compute_dtype, l2norm
from .chunk_plan import make_chunk_plan


def fused_recurrent_gated_delta_rule_torch(
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
    """The PyTorch path of :func:`~llamafactory_zebra.ops.fused_recurrent_gated_delta_rule`."""
    check_gdn_inputs(q, k, v, g, beta, initial_state, cu_seqlens)
    batch, seq_len, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    dtype = compute_dtype(q.dtype)
    scale = key_dim**-0.5 if scale is None else float(scale)
    starts, lengths = segment_bounds(batch, seq_len, cu_seqlens)
    plan = make_chunk_plan(starts, lengths, 1, q.device)

    qf, kf, vf, gf, bf = (t.flatten(0, 1).to(dtype) for t in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        qf, kf = l2norm(qf), l2norm(kf)
    qf = qf * scale
    # Step-major token order: step j reads rows token_index[first_j : first_j + active_j].
    qs, ks, vs = (t[plan.token_index] for t in (qf, kf, vf))
    gs, bs = gf[plan.token_index], bf[plan.token_index]

    if initial_state is None:
        state = qf.new_zeros(len(plan.order), heads, key_dim, value_dim)
    else:
        state = initial_state.to(dtype)[plan.order]
    outputs = []
    for first, active in plan.steps:
        rows = slice(first, first + active)
        decayed = state[:active] * gs[rows].exp()[..., None, None]
        prediction = torch.einsum("nhkv,nhk->nhv", decayed, ks[rows])
        correction = bs[rows][..., None] * (vs[rows] - prediction)
        updated = decayed + ks[rows][..., :, None] * correction[..., None, :]
        outputs.append(torch.einsum("nhkv,nhk->nhv", updated, qs[rows]))
        state = torch.cat([updated, state[active:]])

    o = torch.cat(outputs) if outputs else vf.new_zeros(0, heads, value_dim)
    o = o[plan.token_slot].view(batch, seq_len, heads, value_dim).to(q.dtype)
    if not output_final_state:
        return o, None
    final = torch.empty_like(state).index_copy(0, plan.order, state)
    return o, final

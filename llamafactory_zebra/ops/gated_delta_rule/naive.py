"""The gated delta rule written token by token: slow, obviously correct, the yardstick for the fast paths.

Per head, with state ``S`` of shape ``[K, V]``::

    S <- exp(g_t) * S
    S <- S + k_t (beta_t * (v_t - S^T k_t))^T
    o_t = S^T (scale * q_t)

Each sequence (batch row, or ``cu_seqlens`` segment) is run on its own, one token at a time, in the
input precision (half precision is raised to fp32). Autograd differentiates it directly.
"""

from __future__ import annotations

import torch

from ..segments import segment_bounds
from .checks import check_gdn_inputs, compute_dtype, l2norm


def naive_recurrent_gated_delta_rule(
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
    """Reference with the signature of :func:`chunk_gated_delta_rule` (see there for shapes)."""
    check_gdn_inputs(q, k, v, g, beta, initial_state, cu_seqlens)
    batch, seq_len, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    in_dtype, dtype = q.dtype, compute_dtype(q.dtype)
    scale = key_dim**-0.5 if scale is None else scale
    q, k, v, g, beta = (t.to(dtype).flatten(0, 1) for t in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    starts, lengths = segment_bounds(batch, seq_len, cu_seqlens)

    outputs, finals = [], []
    for seq, (start, length) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
        if initial_state is None:
            state = q.new_zeros(heads, key_dim, value_dim)
        else:
            state = initial_state[seq].to(dtype)
        for t in range(start, start + length):
            state = state * g[t].exp()[:, None, None]
            prediction = torch.einsum("hkv,hk->hv", state, k[t])
            correction = beta[t][:, None] * (v[t] - prediction)
            state = state + k[t][:, :, None] * correction[:, None, :]
            outputs.append(torch.einsum("hkv,hk->hv", state, q[t] * scale))
        finals.append(state)

    o = torch.stack(outputs) if outputs else v.new_zeros(0, heads, value_dim)
    o = o.view(batch, seq_len, heads, value_dim).to(in_dtype)
    return o, torch.stack(finals) if output_final_state else None

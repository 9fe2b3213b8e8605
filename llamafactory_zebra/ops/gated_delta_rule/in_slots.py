"""One decode step of the gated delta rule for a batch of sequences whose states live in slots of one
tensor (a serving engine's state cache), advanced where they lie.

Why this exists: :func:`fused_recurrent_gated_delta_rule_torch` takes the states as a batch and returns
new ones, so a caller holding them in cache slots gathers, steps and scatters back; for Zebra's GDN
state (6 heads x 256 x 512 in fp32, 3 MB a sequence) that is several full copies of every state per
token, each a fresh allocation, and on a CPU decode step at batch 64 it cost 32x this op
(``benchmarks/bench_vllm_gdn_cpu.py``, ``docs/benchmarks.md``, serving). vLLM's own CPU kernel for this step refuses Zebra's head sizes, and
its GPU kernel (fla's fused recurrent op with state indices) needs a GPU. Here each sequence's state is
read once for the two products the step needs and updated once in place, one sequence at a time, so
that the state is still in cache for the second pass.

Per head, with ``S`` the ``[K, V]`` state, q and k already normalised and q scaled::

    p = S^T k,  r = S^T q                     (one matmul, from the old state)
    d = beta (v - exp(g) p)                   (what the token writes)
    S <- exp(g) S + k d^T                     (``addr_`` with ``beta=exp(g)``: one pass)
    o = S^T q = exp(g) r + (k . q) d

which is the token step of ``naive.py`` with the products taken before the update.
"""

from __future__ import annotations

import torch

from .checks import compute_dtype, l2norm


def _check_step_inputs(q, k, v, g, beta, state, state_indices) -> None:
    """Raise ``ValueError`` naming the offending argument."""
    if q.ndim != 3 or k.shape != q.shape:
        raise ValueError(f"q and k must have one shape [N, H, K], got {tuple(q.shape)} and {tuple(k.shape)}.")
    if v.ndim != 3 or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"v must have shape [N, H, V] with N, H = {tuple(q.shape[:2])}, got {tuple(v.shape)}.")
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != q.shape[:2]:
            raise ValueError(f"{name} must have shape [N, H] = {tuple(q.shape[:2])}, got {tuple(t.shape)}.")
    if state.ndim != 4 or tuple(state.shape[1:]) != (q.shape[1], q.shape[2], v.shape[2]):
        raise ValueError(
            f"state must have shape [slots, H, K, V] with H, K, V = {(q.shape[1], q.shape[2], v.shape[2])}, "
            f"got {tuple(state.shape)}."
        )
    if state_indices.shape != (q.shape[0],):
        raise ValueError(f"state_indices must have shape [N] = [{q.shape[0]}], got {tuple(state_indices.shape)}.")


def fused_recurrent_gated_delta_rule_in_slots(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    scale: float | None = None,
    *,
    use_qk_l2norm_in_kernel: bool = False,
) -> torch.Tensor:
    """Advance sequence ``i``'s state ``state[state_indices[i]]`` by its one token, in place.

    Args:
        q, k: ``[N, H, K]``, one token of each of N sequences. v: ``[N, H, V]``.
        g: ``[N, H]`` log-decay (<= 0). beta: ``[N, H]`` write strength.
        state: ``[slots, H, K, V]``, any strides (e.g. a transposed view of a ``[slots, H, V, K]``
            cache) and any float dtype; the N indexed slots are updated in place, the others untouched.
            A sequence with no history must have its slot zeroed first.
        state_indices: ``[N]`` distinct slot numbers.
        scale: multiplies q; defaults to ``K ** -0.5``.
        use_qk_l2norm_in_kernel: L2-normalise q and k first (as the other gated-delta-rule entry points).

    Returns:
        ``o`` ``[N, H, V]`` in q's dtype. The step is computed in fp32 (fp64 for fp64 inputs); a slot of
        another dtype is converted for the step and written back in its own dtype.
    """
    _check_step_inputs(q, k, v, g, beta, state, state_indices)
    slots = state_indices.tolist()
    if len(set(slots)) != len(slots):
        raise ValueError(f"state_indices must be distinct (one slot per sequence), got {slots}.")
    in_dtype, dtype = q.dtype, compute_dtype(q.dtype)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    q, k, v, g, beta = (t.to(dtype) for t in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    q = q * scale
    decay = g.exp()
    keys_and_queries = torch.stack([k, q], dim=2)  # [N, H, 2, K]
    key_query_dot = (k * q).sum(-1, keepdim=True)
    out = torch.empty_like(v)
    for i, slot in enumerate(slots):
        slot_state = state[slot]
        work = slot_state if slot_state.dtype == dtype else slot_state.to(dtype)
        products = torch.bmm(keys_and_queries[i], work)  # [H, 2, V]: S^T k and S^T q
        written = beta[i, :, None] * (v[i] - decay[i, :, None] * products[:, 0])
        for head, head_decay in enumerate(decay[i].tolist()):
            work[head].addr_(k[i, head], written[head], beta=head_decay)
        out[i] = decay[i, :, None] * products[:, 1] + key_query_dot[i] * written
        if work is not slot_state:
            slot_state.copy_(work)
    return out.to(in_dtype)

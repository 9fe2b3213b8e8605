"""The gated delta rule on states that live in slots of one tensor (a serving engine's state cache).

Two ops, each choosing its implementation the way ``dispatch.py`` does (fla's kernels for GPU tensors,
this package's PyTorch code elsewhere), so a serving layer hands over its cache and slot numbers and
never cares where it runs:

- :func:`fused_recurrent_gated_delta_rule_in_slots`: one decode token per sequence;
- :func:`chunk_gated_delta_rule_in_slots`: whole prompt chunks, one ``cu_seqlens`` segment per sequence.

fla 0.6's GDN kernels take states by batch row only (its state-index form exists for KDA, not for the gated delta
rule), so on a GPU the indexed slots are gathered, run through fla's kernel and written back: the contract the
package's dispatch already relies on. On a CPU the decode step advances each slot in place instead: gathering costs
several full copies of every state per token (Zebra's GDN state is 6 heads x 256 x 512 in fp32, 3 MB a sequence), each
a fresh allocation, and vLLM's own CPU kernel for this step refuses Zebra's head sizes. bf16 or fp32 inputs on an fp32
or bf16 state with rows of V contiguous (vLLM's SSM cache as the serving layer views it) are stepped by the C++ kernel
of ``cpu_step.py``, which normalises q and k itself, reads each head's state once for both products and updates it
while it is still in cache; elsewhere (fp64, another layout, no compiler, ``ZEBRA_CPU_KERNELS=torch``)
:func:`_step_in_place` does the same in PyTorch, one sequence at a time. What each buys is measured by
``benchmarks/bench_vllm_gdn_cpu.py`` (``docs/benchmarks.md``, serving).

Per head, with ``S`` the ``[K, V]`` state, q and k already normalised and q scaled::

    p = S^T k,  r = S^T q                     (one matmul, from the old state)
    d = beta (v - exp(g) p)                   (what the token writes)
    S <- exp(g) S + k d^T                     (``addr_`` with ``beta=exp(g)``: one pass)
    o = S^T q = exp(g) r + (k . q) d

which is the token step of ``naive.py`` with the products taken before the update.

Prompt chunks without fla run ``chunk_prefill.py`` on the slots; on a CPU with bf16 dot products
(AVX-512-BF16, Arm's bf16 extension) its GEMMs take bf16 operands for bf16 inputs (as fla's kernels feed
their dot products on a GPU), elsewhere it is the exact path. Both ops are for inference: they write the
cache in place.
"""

from __future__ import annotations

import functools

import torch

from ...kernels import Call, FixedCall, Key, Op, bind, run
from ..backend import fla_function
from ..cpu import cpu_prefill_in_slots, cpu_step_in_slots
from .checks import check_gdn_inputs, compute_dtype, l2norm
from .chunk_prefill import chunk_gated_delta_rule_prefill
from .dispatch import _FLA_GDN


def _check_step_inputs(q, k, v, g, beta, state, state_indices) -> None:
    """Raise ``ValueError`` naming the offending argument."""
    if q.ndim != 3 or k.shape != q.shape:
        raise ValueError(f"q and k must have one shape [N, H, K], got {tuple(q.shape)} and {tuple(k.shape)}.")
    if v.ndim != 3 or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"v must have shape [N, H, V] with N, H = {tuple(q.shape[:2])}, got {tuple(v.shape)}.")
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != q.shape[:2]:
            raise ValueError(f"{name} must have shape [N, H] = {tuple(q.shape[:2])}, got {tuple(t.shape)}.")
    _check_slots(state, state_indices, (q.shape[1], q.shape[2], v.shape[2]), q.shape[0])


def _check_slots(state, state_indices, head_shape: tuple[int, int, int], num_seqs: int) -> None:
    """``state`` is ``[slots, H, K, V]`` and ``state_indices`` names ``num_seqs`` distinct slots."""
    if state.ndim != 4 or tuple(state.shape[1:]) != head_shape:
        raise ValueError(
            f"state must have shape [slots, H, K, V] with H, K, V = {head_shape}, got {tuple(state.shape)}."
        )
    if state_indices.shape != (num_seqs,):
        raise ValueError(f"state_indices must have shape [N] = [{num_seqs}], got {tuple(state_indices.shape)}.")
    slots = state_indices.tolist()
    if len(set(slots)) != len(slots):
        raise ValueError(f"state_indices must be distinct (one slot per sequence), got {slots}.")


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
    chosen: FixedCall | None = None,
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
        chosen: the kernel a serving layer chose once for its fixed call (``kernels.fixed_call`` of
            :func:`decode_step_call`); ``None``: the registry chooses at this call.

    Returns:
        ``o`` ``[N, H, V]`` in q's dtype. The step is computed in fp32 (fp64 for fp64 inputs); a slot of
        another dtype is converted for the step and written back in its own dtype.
    """
    _check_step_inputs(q, k, v, g, beta, state, state_indices)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    arguments = (q, k, v, g, beta, state, state_indices, scale, use_qk_l2norm_in_kernel)
    if chosen is not None:
        return chosen(*arguments)
    return run(Op.GDN_DECODE_STEP, decode_step_call(q.device.type, q.dtype, state), *arguments)


def decode_step_call(device_type: str, dtype: torch.dtype, state: torch.Tensor | torch.dtype) -> Call:
    """The ``GDN decode step`` call for ``dtype`` inputs on ``state`` (a tensor, or the dtype of a state whose
    rows are contiguous in V, as a serving layer knows it before its cache exists)."""
    if isinstance(state, torch.dtype):
        return Call.on(device_type, dtype, state_dtype=state, state_rows_contiguous=True)
    return Call.on(device_type, dtype, state_dtype=state.dtype, state_rows_contiguous=state.stride(-1) == 1)


def _step_fla(q, k, v, g, beta, state, state_indices, scale, use_qk_l2norm_in_kernel) -> torch.Tensor:
    """fla's kernel on the gathered slots, the final states written back (fla 0.6 takes no state indices)."""
    o, final = fla_function((_FLA_GDN,), "fused_recurrent_gated_delta_rule")(
        q=q[:, None],
        k=k[:, None],
        v=v[:, None],
        g=g[:, None],
        beta=beta[:, None],
        scale=scale,
        initial_state=state[state_indices].to(compute_dtype(q.dtype)),
        output_final_state=True,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )
    state[state_indices] = final.to(state.dtype)
    return o[:, 0]


def _step_torch(q, k, v, g, beta, state, state_indices, scale, use_qk_l2norm_in_kernel) -> torch.Tensor:
    in_dtype, dtype = q.dtype, compute_dtype(q.dtype)
    q, k, v, g, beta = (t.to(dtype) for t in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    return _step_in_place(q * scale, k, v, g.exp(), beta, state, state_indices.tolist()).to(in_dtype)


def _step_in_place(q, k, v, decay, beta, state, slots) -> torch.Tensor:
    """The PyTorch path of :func:`fused_recurrent_gated_delta_rule_in_slots` (see the module docstring) on
    prepared inputs: q and k normalised, q scaled, ``decay = exp(g)``, all in the compute dtype."""
    dtype = q.dtype
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
    return out


def chunk_gated_delta_rule_in_slots(
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
    chosen: FixedCall | None = None,
) -> torch.Tensor:
    """Run segment ``i`` of a packed prompt chunk from slot ``state_indices[i]`` and store its final state there.

    Args:
        q, k: ``[1, T, H, K]``, the sequences' tokens packed along T. v: ``[1, T, H, V]``.
        g: ``[1, T, H]`` log-decay (<= 0). beta: ``[1, T, H]`` write strength.
        state: ``[slots, H, K, V]``, any strides and float dtype; the indexed slots are overwritten with
            the final states, the others untouched.
        state_indices: ``[N]`` distinct slot numbers, one per segment.
        cu_seqlens: ``[N + 1]`` segment borders over T; no state crosses a border.
        has_initial_state: ``[N]`` bool; a segment without one starts from zeros (its slot is not read).
        scale, use_qk_l2norm_in_kernel: as :func:`~llamafactory_zebra.ops.chunk_gated_delta_rule`.
        chosen: as :func:`fused_recurrent_gated_delta_rule_in_slots`'s (of :func:`prefill_call`).

    Returns ``o`` ``[1, T, H, V]`` in q's dtype.
    """
    check_gdn_inputs(q, k, v, g, beta, None, cu_seqlens)
    if cu_seqlens is None:
        raise ValueError("cu_seqlens is required: one segment per state slot.")
    num_seqs = cu_seqlens.numel() - 1
    _check_slots(state, state_indices, (q.shape[2], q.shape[3], v.shape[3]), num_seqs)
    if has_initial_state.shape != (num_seqs,) or has_initial_state.dtype != torch.bool:
        raise ValueError(
            f"has_initial_state must be a bool tensor of shape [N] = [{num_seqs}] (one per cu_seqlens segment), "
            f"got {has_initial_state.dtype} {tuple(has_initial_state.shape)}."
        )
    arguments = (q, k, v, g, beta, state, state_indices, cu_seqlens, has_initial_state, scale)
    if chosen is not None:
        return chosen(*arguments, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    call = prefill_call(q.device.type, q.dtype, state.dtype)
    return run(Op.GDN_PREFILL_IN_SLOTS, call, *arguments, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)


def prefill_call(device_type: str, dtype: torch.dtype, state_dtype: torch.dtype) -> Call:
    """The ``GDN prefill in slots`` call for ``dtype`` inputs on a ``state_dtype`` state."""
    return Call.on(device_type, dtype, state_dtype=state_dtype)


def _prefill_fla(
    q, k, v, g, beta, state, state_indices, cu_seqlens, has_initial_state, scale, *, use_qk_l2norm_in_kernel
) -> torch.Tensor:
    """fla's kernel on the gathered slots, the final states written back (fla 0.6 takes no state indices)."""
    if bool(has_initial_state.any()):
        initial_state = state[state_indices].to(compute_dtype(q.dtype))
        initial_state[~has_initial_state] = 0
    else:
        initial_state = None  # every sequence's first chunk (the usual prefill): no slot to read
    o, final = fla_function((_FLA_GDN,), "chunk_gated_delta_rule")(
        q=q,
        k=k,
        v=v,
        g=g,
        beta=beta,
        scale=scale,
        initial_state=initial_state,
        output_final_state=True,
        cu_seqlens=cu_seqlens.to(torch.int64),
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )
    state[state_indices] = final.to(state.dtype)
    return o


bind(Op.GDN_DECODE_STEP, {Key.FLA: _step_fla, Key.CPP: cpu_step_in_slots, Key.TORCH: _step_torch})
bind(
    Op.GDN_PREFILL_IN_SLOTS,
    {
        Key.FLA: _prefill_fla,
        # The prefill with its GEMM operands' dtype fixed.
        Key.CPP_BF16_GEMM: functools.partial(cpu_prefill_in_slots, bf16_operands=True),
        Key.CPP: functools.partial(cpu_prefill_in_slots, bf16_operands=False),
        Key.TORCH_BF16_GEMM: functools.partial(chunk_gated_delta_rule_prefill, matmul_dtype=torch.bfloat16),
        Key.TORCH: chunk_gated_delta_rule_prefill,
    },
)

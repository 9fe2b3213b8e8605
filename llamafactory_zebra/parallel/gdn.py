"""Gated DeltaNet across sequence-parallel ranks, exactly: conv halo + affine state summaries.

Why summaries and not heads: Ulysses splits heads, and Zebra's 6 GDN heads do not divide by 8 ranks.
Why not pass the state rank to rank: that serialises the ranks (rank 7 waits for 0…6).

The recurrence is affine in its entering state, per head: ``S_end = M S_0 + S_ext`` (``M`` is
``K x K``). Running the unchanged chunk op on an augmented state ``[S | M]`` (``K x (V + K)``, started
at ``[0 | I]``, values padded with ``K`` zeros) gives, in one pass over the shard:

- the final ``[S_ext | M]`` of each row's last local run: one fp32 all-gather of these summaries
  (size independent of sequence length) and a prefix combine give every rank the true state ``S_in``
  entering its shard;
- per token, ``o_aug = [S_ext,t^T q_t | M_t^T q_t]``, so the exact output of a run that continues a
  sample is ``o = o_aug[:V] + o_aug[V:] S_in``: no second pass with the true state is needed.

Runs that begin inside the shard start from zero state (their ``M`` part is unused), and a shard whose
last run began inside it passes ``M = 0``, so the chain restarts at every sample border wherever it
falls. The same code runs fla's kernels on GPUs and the PyTorch chunk op on CPUs; autograd through the
op (its final-state gradient included) and the all-gather gives the backward. The idea follows fla's
context-parallel GDN (``fla/ops/cp``, PR #691; MIT, Copyright (c) 2023-2025 Songlin Yang, Yu Zhang).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..ops import chunk_gated_delta_rule
from .collectives import all_gather, anchor

if TYPE_CHECKING:
    from .context import SequenceParallelContext


def halo_mask(context: SequenceParallelContext, width: int) -> torch.Tensor:
    """``[B, width]``: which of the ``width`` tokens before this shard belong to the sample it continues."""
    positions = torch.arange(context.offset - width, context.offset, device=context.global_runs.device)
    runs = context.global_runs[:, positions.clamp(min=0)]
    same = runs == context.global_runs[:, context.offset : context.offset + 1]
    return same & (positions >= 0) & context.continues[:, None]


def conv_halo_states(
    context: SequenceParallelContext, features: tuple[torch.Tensor, ...], width: int
) -> tuple[torch.Tensor, ...]:
    """Per feature ``[1, B * T_local, D]``, the ``[N, D, width]`` ``initial_state`` (``ops.causal_conv1d``
    layout) of the local runs: for a row's first run, the ``width - 1`` inputs before the shard that
    belong to the same sample (zeros elsewhere); every other run starts from zeros.

    All features travel in one all-gather of each rank's last ``width - 1`` tokens; a shard shorter
    than that sends all it has, and the halo is read off the concatenation of earlier ranks' tails.
    """
    halo = width - 1
    batch, local = context.batch, context.local_length
    sizes = [f.shape[-1] for f in features]
    rows = torch.cat([f.reshape(batch, local, -1) for f in features], dim=-1)
    tail = min(local, halo)
    gathered = all_gather(rows[:, local - tail :], context.layout.group)  # [sp, B, tail, D]
    before = gathered.permute(1, 0, 2, 3).reshape(batch, -1, rows.shape[-1])
    before = torch.cat([before.new_zeros(batch, halo, rows.shape[-1]), before], dim=1)
    start = context.layout.rank * tail
    window = before[:, start : start + halo] * halo_mask(context, halo)[..., None].to(rows.dtype)

    num_runs = context.cu_seqlens.numel() - 1
    row_state = torch.cat([window.new_zeros(batch, 1, rows.shape[-1]), window], dim=1).transpose(1, 2)
    states = rows.new_zeros(num_runs, rows.shape[-1], width).index_put((context.first_run,), row_state)
    return tuple(states.split(sizes, dim=1))


def chunk_gated_delta_rule_sp(
    context: SequenceParallelContext,
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
) -> tuple[torch.Tensor, None]:
    """``ops.chunk_gated_delta_rule`` for flattened shards ``[1, B * T_local, H, ·]`` with the context's
    ``cu_seqlens``; samples may span ranks. Training/prefill only: no initial or final state."""
    if initial_state is not None or output_final_state:
        raise ValueError("sequence-parallel GDN runs from zero state and returns no final state (no decode cache)")
    if cu_seqlens is not None and not torch.equal(cu_seqlens.cpu(), context.cu_seqlens.cpu()):
        raise ValueError("cu_seqlens differ from the sequence-parallel context's borders for this shard")
    _, tokens, heads, key_dim = k.shape
    value_dim = v.shape[-1]
    num_runs = context.cu_seqlens.numel() - 1
    v_aug = torch.cat([v, v.new_zeros(*v.shape[:-1], key_dim)], dim=-1)
    state0 = torch.zeros(
        num_runs,
        heads,
        key_dim,
        value_dim + key_dim,
        dtype=torch.promote_types(v.dtype, torch.float32),
        device=v.device,
    )
    state0[..., value_dim:] = torch.eye(key_dim, dtype=state0.dtype, device=v.device)
    o_aug, final = chunk_gated_delta_rule(
        q,
        k,
        v_aug,
        g,
        beta,
        scale=scale,
        initial_state=state0,
        output_final_state=True,
        cu_seqlens=context.cu_seqlens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )

    passes_state = (context.continues & (context.first_run == context.last_run)).to(final.dtype)
    summary = final[context.last_run]  # [B, H, K, V + K]
    summary = torch.cat([summary[..., :value_dim], summary[..., value_dim:] * passes_state[:, None, None, None]], -1)
    summaries = all_gather(summary, context.layout.group)  # [sp, B, H, K, V + K]

    entering = summary.new_zeros(summary.shape[:-1] + (value_dim,))
    for earlier in summaries[: context.layout.rank]:
        entering = earlier[..., value_dim:] @ entering + earlier[..., :value_dim]
    entering = anchor(entering, summaries)

    batch, local = context.batch, context.local_length
    reads = o_aug[..., value_dim:].reshape(batch, local, heads, key_dim).to(entering.dtype)
    carried = torch.einsum("bthk,bhkv->bthv", reads, entering)
    carried = carried * context.continued_tokens[..., None, None].to(carried.dtype)
    output = o_aug[..., :value_dim] + carried.reshape(1, tokens, heads, value_dim).to(o_aug.dtype)
    return output, None

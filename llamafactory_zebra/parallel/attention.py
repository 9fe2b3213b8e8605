"""Ulysses attention for MLA: trade sequence shards for head shards, attend over whole rows, trade back.

Why not DeepSpeed's ``UlyssesSPAttentionHF``: it drops every attention mask except a flex BlockMask
(packed samples would leak under sdpa), requires one head size for q/k/v (MLA's are set separately),
and is registered by overwriting a transformers attention backend process-wide. Here the wrapper is
built per forward from the :class:`~.context.SequenceParallelContext`, so it knows the sample borders
of the whole rows and hands them to the core attention in the form it reads:

- FlashAttention-2/3 and sdpa: the borders themselves over all ``B * T`` tokens of the whole rows, no
  mask (``packing.flash_varlen_kwargs``); sdpa reads them through ``layers/mla.py``'s packed-row functions,
  which the layer hands in as ``core_attention`` (``kernels.packed_attention``);
- eager: the ``[B, 1, T, T]`` block-diagonal causal mask (quadratic: CPU and short rows only).

RoPE has already been applied on each rank with the shard's global positions. Key/value heads that do
not divide by the SP size are replicated (``repeat_interleave`` keeps each query head on its key head).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import nn

from ..attention_policy import SEQUENCE_PARALLEL_ATTENTION
from ..kernels import packed_attention
from ..packing import block_causal_mask, flash_varlen_kwargs
from .collectives import all_to_all

if TYPE_CHECKING:
    from .context import SequenceParallelContext


class _HeadSliceView:
    """The attention module as the core attention sees it: every attribute of the layer, but the query
    heads per key head of the head slice (changed when key heads were replicated)."""

    def __init__(self, module: nn.Module, num_key_value_groups: int) -> None:
        self._wrapped = module
        self.num_key_value_groups = num_key_value_groups

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


def ulysses_attention(
    context: SequenceParallelContext, core_attention: Callable, attn_implementation: str | None
) -> Callable:
    if attn_implementation not in (None, *SEQUENCE_PARALLEL_ATTENTION):
        raise ValueError(
            f"attn_implementation={attn_implementation!r} cannot keep packed samples apart under sequence "
            f"parallelism; use one of {', '.join(SEQUENCE_PARALLEL_ATTENTION)}"
        )
    group, size = context.layout.group, context.layout.size
    borders = packed_attention(attn_implementation, context.global_runs.device.type).reads_borders
    varlen = flash_varlen_kwargs(context.global_runs) if borders else {}

    def attend(module, query, key, value, attention_mask, **kwargs):
        heads, kv_heads = query.shape[1], key.shape[1]
        if heads % size:
            raise ValueError(f"{heads} attention heads do not divide by sequence_parallel_size={size}")
        if kv_heads % size:
            replicas = math.lcm(kv_heads, size) // kv_heads
            key, value = key.repeat_interleave(replicas, dim=1), value.repeat_interleave(replicas, dim=1)
        query, key, value = (all_to_all(x, scatter_dim=1, gather_dim=2, group=group) for x in (query, key, value))
        view = _HeadSliceView(module, query.shape[1] // key.shape[1])
        if borders:
            kwargs.pop("position_ids", None)  # this shard's positions; the borders above cover whole rows
            kwargs.update(varlen)
            mask = None
        else:
            mask = block_causal_mask(context.global_runs)
        output, _ = core_attention(view, query, key, value, mask, **kwargs)  # [B, T, heads / sp, D]
        return all_to_all(output, scatter_dim=1, gather_dim=2, group=group), None

    return attend

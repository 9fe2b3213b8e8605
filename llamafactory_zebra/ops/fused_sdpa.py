"""MLA's attention through PyTorch's fused sdpa kernel on a CPU, whose memory grows linearly with the prompt.

Why: PyTorch's CPU ``scaled_dot_product_attention`` has one fused kernel (blockwise, flash-style), and it takes
one head size for q, k and v only. MLA's heads can have two (q/k ``nope + rope``, v ``v_head_dim``: 64 and 32 in
``tiny-16k``), so transformers' sdpa function lands in the math kernel, which forms the ``[B, heads, T, T]``
scores and their softmax: 2.5 GB at 8K tokens with ``tiny-16k``'s 4 heads, 40 GB at 32K, which is what killed
a plain ``generate`` on a 32K prompt (``benchmarks/bench_generate_memory.py``, docs/benchmarks.md).

:func:`fused_kernel_operands` pads the narrower heads with zero columns to the wider size, which the fused
kernel takes; zero columns change no score (the softmax scale is passed explicitly, not taken from the padded
width) and add only zero output columns, which are cut off. It also repeats the key/value heads to the query
heads (a copy linear in ``T``), so the call does not depend on whether this PyTorch's fused CPU kernel takes
``enable_gqa`` (2.14's does).
``per_segment_sdpa`` (packed rows, ``packed_attention.py``) and :func:`fused_sdpa_attention` (one sequence
per row, a mask or none) both call it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def fused_kernel_operands(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """``query`` ``[B, heads, T, qk]``, ``key`` ``[B, kv_heads, S, qk]``, ``value`` ``[B, kv_heads, S, v]`` as the
    fused kernel takes them: key/value heads repeated to ``heads`` (query head ``h`` reads key head
    ``h // groups``, as ``repeat_kv`` pairs them), every head zero-padded to ``max(qk, v)``. Returns them and
    ``v``, the output columns to keep."""
    heads = query.shape[1]
    groups = heads // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    value_dim, width = value.shape[-1], max(query.shape[-1], value.shape[-1])
    query, key, value = (F.pad(x, (0, width - x.shape[-1])) if x.shape[-1] < width else x for x in (query, key, value))
    return query, key, value, value_dim


def fused_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention function (same contract, ``[B, T, heads, v]`` out) on the operands of
    :func:`fused_kernel_operands`. As transformers' function does, a call of more than one query with no mask
    is causal (aligned at the first key) and a mask is passed on as it is."""
    if scaling is None:
        scaling = query.shape[-1] ** -0.5  # the unpadded q/k head size, as sdpa's default would use
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = query.shape[2] > 1 and attention_mask is None and causal
    query, key, value, value_dim = fused_kernel_operands(query, key, value)
    output = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal
    )
    return output[..., :value_dim].transpose(1, 2).contiguous(), None

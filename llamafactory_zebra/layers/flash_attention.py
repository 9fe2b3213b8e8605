"""FlashAttention-2/3 for MLA through transformers' own flash-attention core, minus one upstream bug.

transformers 5.6.0's ``integrations.flash_attention.flash_attention_forward`` calls ``s_aux.to(...)``
unconditionally, so every model without attention sinks — Zebra included — raises
``AttributeError: 'NoneType' object has no attribute 'to'`` on its first FA2 forward
(huggingface/transformers#45588, fixed by #45589 after 5.6.0; this package allows 5.6.0). This wrapper
does what that one does for a sink-less model — transpose to FA's ``[B, T, heads, D]`` layout, cast
fp32 activations back to the weights' dtype, take ``is_causal`` from the module — and hands everything
else, packing included, to transformers' ``_flash_attention_forward``, which picks the varlen kernel.
Zebra's MLA calls it directly; ``integration.registrations.register_sinkless_flash_attention`` puts
:func:`sinkless_flash_attention` behind transformers' ``AttentionInterface`` for other models loaded in
the same process (the distillation teacher). Drop it once the transformers floor is past 5.6.0. Which
attention implementations exist and who takes which: ``attention_policy.py``.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.integrations.flash_attention import get_target_dtype
from transformers.modeling_flash_attention_utils import _flash_attention_forward, flash_attn_supports_top_left_mask


def flash_attention_forward(
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
    """Same contract as transformers' attention functions: ``[B, heads, T, D]`` in, ``[B, T, heads, D]`` out."""
    if any(dim == 0 for dim in query.shape):
        raise ValueError(f"FlashAttention cannot take a query with a zero dimension, got {tuple(query.shape)}")
    kwargs.pop("output_attentions", None)
    query_length = query.shape[2]
    query, key, value = (x.transpose(1, 2) for x in (query, key, value))
    output = _flash_attention_forward(
        query,
        key,
        value,
        attention_mask,
        query_length=query_length,
        is_causal=module.is_causal if is_causal is None else is_causal,
        dropout=dropout,
        softmax_scale=scaling,
        use_top_left_mask=flash_attn_supports_top_left_mask(),
        target_dtype=get_target_dtype(query, module),
        attn_implementation=module.config._attn_implementation,
        layer_idx=getattr(module, "layer_idx", None),
        **kwargs,
    )
    return output, None


def sinkless_flash_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """What ``integration.registrations.register_sinkless_flash_attention`` puts behind transformers'
    ``AttentionInterface`` for FlashAttention: calls that carry sinks (``s_aux``) still go to transformers'
    own function, so models that have them are unaffected; every other call goes to this module's."""
    if kwargs.get("s_aux") is not None:
        from transformers.integrations.flash_attention import flash_attention_forward as upstream_forward

        return upstream_forward(module, query, key, value, attention_mask, **kwargs)
    kwargs.pop("s_aux", None)
    return flash_attention_forward(module, query, key, value, attention_mask, **kwargs)

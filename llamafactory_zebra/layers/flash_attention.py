"""FlashAttention-2/3 for MLA through transformers' own flash-attention core, minus one upstream bug.

transformers 5.6.0's ``integrations.flash_attention.flash_attention_forward`` calls ``s_aux.to(...)``
unconditionally, so every model without attention sinks — Zebra included — raises
``AttributeError: 'NoneType' object has no attribute 'to'`` on its first FA2 forward
(huggingface/transformers#45588, fixed by #45589 after 5.6.0; this package allows 5.6.0). This wrapper
does what that one does for a sink-less model — transpose to FA's ``[B, T, heads, D]`` layout, cast
fp32 activations back to the weights' dtype, take ``is_causal`` from the module — and hands everything
else, packing included, to transformers' ``_flash_attention_forward``, which picks the varlen kernel.
Zebra's MLA calls it directly; :func:`register_sinkless_flash_attention` puts it behind transformers'
``AttentionInterface`` for other models loaded in the same process (the distillation teacher). Drop it
once the transformers floor is past 5.6.0.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.integrations.flash_attention import get_target_dtype
from transformers.modeling_flash_attention_utils import _flash_attention_forward, flash_attn_supports_top_left_mask

# The attention Zebra takes — the one list; the model, sequence parallelism, the distillation teacher,
# the planner and the guards read it. As transformers' ``attn_implementation``: FlashAttention gets the
# packed samples' borders as varlen arguments, eager/sdpa a block-causal mask (``packing.py``).
FLASH_ATTENTION_BACKENDS = ("flash_attention_2", "flash_attention_3")
MASK_BACKENDS = ("eager", "sdpa")

# As LLaMA-Factory's ``flash_attn``, with the ``attn_implementation`` it gives a Zebra model: ``auto``
# keeps transformers' default (sdpa), and ``fa2`` falls back to sdpa when flash-attn is not installed.
LLAMAFACTORY_FLASH_ATTN = {"auto": "sdpa", "disabled": "eager", "sdpa": "sdpa", "fa2": "flash_attention_2"}
# LLaMA-Factory values Zebra cannot run with, and why.
REFUSED_FLASH_ATTN = {
    "fa3": 'LLaMA-Factory 0.9.5 raises "Unknown attention type" for it when it loads the model, after the dataset '
    "is tokenised; use flash_attn: fa2 on GPUs (FlashAttention-2's varlen path keeps packed samples apart) or sdpa",
}


def attn_implementation_for(flash_attn: object) -> str:
    """The ``attn_implementation`` a Zebra model gets from LLaMA-Factory's ``flash_attn`` (a string or its enum).

    >>> attn_implementation_for("fa2"), attn_implementation_for("auto")
    ('flash_attention_2', 'sdpa')
    >>> attn_implementation_for("fa3")
    Traceback (most recent call last):
    ...
    ValueError: flash_attn: fa3 is not supported for Zebra: LLaMA-Factory 0.9.5 raises "Unknown attention type" ...
    """
    value = str(getattr(flash_attn, "value", flash_attn))
    if value in REFUSED_FLASH_ATTN:
        raise ValueError(f"flash_attn: {value} is not supported for Zebra: {REFUSED_FLASH_ATTN[value]}")
    if value not in LLAMAFACTORY_FLASH_ATTN:
        raise ValueError(f"flash_attn: {value!r} is not one of {', '.join(LLAMAFACTORY_FLASH_ATTN)}")
    return LLAMAFACTORY_FLASH_ATTN[value]


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


def register_sinkless_flash_attention() -> None:
    """Register, through transformers' ``AttentionInterface``, FlashAttention functions that work for models
    without attention sinks (every Qwen3 and Llama) on transformers 5.6.0.

    Calls that carry sinks (``s_aux``) still go to transformers' own function, so models that have them
    are unaffected. The registration is process-wide; it goes through the plugin's inventory of
    transformers changes (``integration/seams.py``, ``TRANSFORMERS_REGISTRATIONS``), which keeps a function
    someone else registered and makes a second call change nothing.
    """
    from ..integration.seams import register_attention_function

    for backend in FLASH_ATTENTION_BACKENDS:
        register_attention_function(backend, _flash_attention_with_upstream_sinks)


def _flash_attention_with_upstream_sinks(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    if kwargs.get("s_aux") is not None:
        from transformers.integrations.flash_attention import flash_attention_forward as upstream_forward

        return upstream_forward(module, query, key, value, attention_mask, **kwargs)
    kwargs.pop("s_aux", None)
    return flash_attention_forward(module, query, key, value, attention_mask, **kwargs)

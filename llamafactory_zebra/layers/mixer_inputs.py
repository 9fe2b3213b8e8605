"""What every layer of one forward gets besides the hidden states: the samples' borders of packed rows, the MLA
attention mask or the borders its kernel reads, the GDN padding mask, the sequence-parallel context.

Built once per forward by ``ZebraModel.forward`` (as ``Qwen3NextModel`` builds its causal and linear-attention
masks), in a module of its own because the rules are the packing contract's, not the model's: when ``position_ids``
restart inside a row (LLaMA-Factory's ``packing``), when the 2-D attention mask carries segment ids 1, 2, 3…
(``neat_packing``) or when a 4-D block-diagonal mask is given, the segments are derived once (``packing.py``) and
handed to both mixers.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache
from transformers.masking_utils import create_causal_mask

from ..attention_policy import EAGER
from ..configuration_zebra import ZebraConfig
from ..kernels import packed_attention
from ..packing import block_causal_mask, cu_seqlens_from_segment_ids, flash_varlen_kwargs, packed_segment_ids
from ..parallel import (
    SequenceParallelContext,
    SequenceParallelLayout,
    build_sequence_parallel_context,
    gather_row_segment_ids,
)


def sample_borders(
    sequence_parallel: SequenceParallelLayout | None,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor,
    past_key_values: Cache | None,
) -> tuple[torch.Tensor | None, SequenceParallelContext | None]:
    """``[B, T]`` sample ids when rows are packed (else ``None``), and the sequence-parallel context."""
    if past_key_values is not None:
        # Decoding: rows are single (possibly left-padded) sequences, whose generate()-made
        # position_ids restart at the padding and must not be read as packing.
        if attention_mask is not None and attention_mask.dim() == 2 and bool((attention_mask > 1).any()):
            raise ValueError("Packed sequences (segment ids in attention_mask) cannot be used with a decode cache")
        return None, None
    if sequence_parallel is not None:
        whole_rows = gather_row_segment_ids(sequence_parallel, position_ids, attention_mask)
        context = build_sequence_parallel_context(sequence_parallel, whole_rows)
        return context.local_segment_ids, context
    return packed_segment_ids(attention_mask, position_ids), None


def mixer_inputs(
    config: ZebraConfig,
    inputs_embeds: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor,
    past_key_values: Cache | None,
    segment_ids: torch.Tensor | None,
    sp_context: SequenceParallelContext | None,
    output_attentions: bool = False,
) -> dict[str, Any]:
    """The per-mixer inputs every layer gets:

    - GDN: ``cu_seqlens`` (packed rows; see ``packing.py``) and ``padding_mask`` (1 = token);
    - MLA: ``attention_mask`` (causal, the caller's 4-D mask, block-causal for eager, or ``None``) and,
      for packed rows on FlashAttention or sdpa, the samples' borders as FlashAttention's varlen
      arguments (``cu_seq_lens_q/k``), with no mask, when the entry ``kernels.packed_attention`` chooses (the
      registry's ``attention`` op) reads them (``reads_borders``; FlashAttention's also over a caller's
      4-D mask, ``ignores_masks``);
    - both, under sequence parallelism: ``sp_context``, whose mixers exchange what crosses shards;
    - MLA, ``output_attentions``: the attention maps are wanted, so packed rows get the block-causal mask
      (eager's) rather than borders, which no kernel that returns weights reads.
    """
    if segment_ids is None:
        padding_mask = None
        if attention_mask is not None and attention_mask.dim() == 2 and bool((attention_mask == 0).any()):
            padding_mask = attention_mask[:, -inputs_embeds.shape[1] :]
        causal_mask = create_causal_mask(
            config=config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            position_ids=position_ids,
        )
        return {
            "attention_mask": causal_mask,
            "cu_seqlens": None,
            "padding_mask": padding_mask,
            "output_attentions": output_attentions,
        }
    inputs = {
        "attention_mask": None,
        "padding_mask": (segment_ids != 0).to(inputs_embeds.dtype),
        "output_attentions": output_attentions,
    }
    if sp_context is not None:
        inputs.update(cu_seqlens=sp_context.cu_seqlens, sp_context=sp_context)
        return inputs
    inputs["cu_seqlens"] = cu_seqlens_from_segment_ids(segment_ids)
    implementation = EAGER if output_attentions else config._attn_implementation
    entry = packed_attention(implementation, inputs_embeds.device.type)
    given_mask = attention_mask is not None and attention_mask.dim() == 4
    if entry.reads_borders and (entry.ignores_masks or not given_mask):
        inputs.update(flash_varlen_kwargs(segment_ids))
    elif given_mask:
        inputs["attention_mask"] = attention_mask
    else:
        inputs["attention_mask"] = block_causal_mask(segment_ids)
    return inputs

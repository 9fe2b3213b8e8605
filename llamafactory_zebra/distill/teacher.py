"""The frozen teacher: loaded once per rank, replicated, and fed the student's batch with samples kept apart.

Replicated, not ZeRO-3-partitioned: the teacher only runs forwards, once per micro-batch and all of its
layers; partitioned, each rank would all-gather every teacher weight on every micro-batch (the teacher's
full size in traffic per step), while a bf16 Qwen3-8B copy is 16 GB per GPU — affordable next to a
1.7B-2B student on 80-192 GB devices. So the teacher is loaded outside DeepSpeed's ``zero.Init``
(transformers would otherwise partition it at load time) and never wrapped by DeepSpeed or DDP.

Packed batches: the student (Zebra) reads LLaMA-Factory's neat-packing segment ids from the 2-D mask
itself; a Transformer teacher would read them as a plain padding mask and attend across samples. The
teacher gets a 4-D block-diagonal causal mask instead, or, with FlashAttention, the samples' borders
as its varlen arguments and positions restarting per sample (``packing.flash_varlen_kwargs`` and
``packing.positions_within_segments``, the rules the student follows).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ..packing import block_causal_mask, flash_varlen_kwargs, packed_segment_ids, positions_within_segments


@contextlib.contextmanager
def outside_zero3_init(hf_deepspeed_config: Any) -> Iterator[None]:
    """Load a model whole even though the Trainer's DeepSpeed ZeRO-3 config is active in this process."""
    if hf_deepspeed_config is None:
        yield
        return
    from transformers.integrations.deepspeed import set_hf_deepspeed_config, unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        set_hf_deepspeed_config(hf_deepspeed_config)


def load_teacher(
    path: str,
    device: torch.device,
    dtype: torch.dtype,
    attn_implementation: str,
    trust_remote_code: bool = False,
    hf_deepspeed_config: Any = None,
) -> nn.Module:
    """``AutoModelForCausalLM`` in eval mode on ``device``, every parameter frozen.

    With FlashAttention, transformers 5.6.0's own FA function fails on the first forward of any model
    without attention sinks (``layers/flash_attention.py``); the training seam registers the fixed one
    before the trainer loads the teacher (``integration.distill.distill_step``).
    """
    from transformers import AutoModelForCausalLM

    with outside_zero3_init(hf_deepspeed_config):
        teacher = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, attn_implementation=attn_implementation, trust_remote_code=trust_remote_code
        )
    teacher.to(device).eval().requires_grad_(False)
    return teacher


def teacher_inputs(
    batch: dict[str, torch.Tensor], dtype: torch.dtype, flash_attention: bool
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Keyword inputs for the teacher's decoder with packed samples isolated, and the ``[B, T]`` real-token mask."""
    input_ids = batch["input_ids"]
    attention_mask = batch.get("attention_mask")
    position_ids = batch.get("position_ids")
    segments = packed_segment_ids(attention_mask, position_ids)
    if segments is None:
        real = (attention_mask != 0) if attention_mask is not None and attention_mask.dim() == 2 else None
        real = real if real is not None else torch.ones_like(input_ids, dtype=torch.bool)
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if position_ids is not None:
            inputs["position_ids"] = position_ids
        return inputs, real
    real = segments != 0
    if flash_attention:
        inputs = {"input_ids": input_ids, "position_ids": positions_within_segments(segments)}
        return {**inputs, **flash_varlen_kwargs(segments)}, real
    visible = block_causal_mask(segments)
    additive = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(
        ~visible, torch.finfo(dtype).min
    )
    inputs = {"input_ids": input_ids, "attention_mask": additive}
    if position_ids is not None:
        inputs["position_ids"] = position_ids
    return inputs, real

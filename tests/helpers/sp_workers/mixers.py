"""Per-rank checks of the GDN and MLA layers under sequence parallelism against one-process runs.

Every rank builds the same layer and the same whole-row inputs (same seed), runs the one-process
reference itself, then its own shard with the SP context, and reports the largest differences of the
outputs, the input gradients and the parameter gradients (summed over the SP group), in fp64.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from llamafactory_zebra.modeling_zebra import ZebraRotaryEmbedding
from llamafactory_zebra.packing import block_causal_mask, cu_seqlens_from_segment_ids
from llamafactory_zebra.parallel import build_sequence_parallel_context, new_layout

from .harness import packed_segments

# Sample lengths per row (negative: padding) for each SP size, with the local length per rank. They put
# borders inside shards, exactly on shard borders, samples shorter than the 3-token conv halo across a
# border, samples covering whole shards, padding, and (T_local 2) halos that reach back over two ranks.
LAYOUTS = {
    2: [
        (12, [[5, 7, 12], [11, 2, 8, -3], [24]]),
        (2, [[1, 3]]),
        (70, [[30, 100, 10]]),
    ],
    4: [
        (8, [[3, 5, 9, 2, 13], [7, 2, 6, 1, 1, 12, -3], [4, 20, 8]]),
        (2, [[1, 6, 1], [8]]),
        (40, [[30, 100, 10, 20]]),
    ],
}


def _gdn_errors(layer, layout, segments: torch.Tensor) -> dict[str, float]:
    batch, length = segments.shape
    hidden = torch.randn(batch, length, layer.q_proj.in_features, dtype=torch.float64)
    upstream = torch.randn(batch, length, layer.o_proj.out_features, dtype=torch.float64)
    padding = (segments != 0).double()

    x_ref = hidden.clone().requires_grad_()
    out_ref = layer(x_ref, cu_seqlens=cu_seqlens_from_segment_ids(segments), padding_mask=padding)
    (out_ref * upstream).sum().backward()
    ref_grads = {name: p.grad.clone() for name, p in layer.named_parameters()}
    layer.zero_grad()

    context = build_sequence_parallel_context(layout, segments)
    shard = context.shard
    x = hidden[:, shard].clone().requires_grad_()
    out = layer(x, cu_seqlens=context.cu_seqlens, padding_mask=padding[:, shard], sp_context=context)
    (out * upstream[:, shard]).sum().backward()
    param_error = 0.0
    for name, p in layer.named_parameters():
        dist.all_reduce(p.grad, group=layout.group)
        param_error = max(param_error, (p.grad - ref_grads[name]).abs().max().item())
    layer.zero_grad()
    return {
        "gdn_out": (out - out_ref[:, shard]).abs().max().item(),
        "gdn_dx": (x.grad - x_ref.grad[:, shard]).abs().max().item(),
        "gdn_dparams": param_error,
        "gdn_out_scale": out_ref.abs().max().item(),
    }


def _mla_errors(layer, config, layout, segments: torch.Tensor) -> dict[str, float]:
    batch, length = segments.shape
    positions = torch.arange(length).expand(batch, -1)
    hidden = torch.randn(batch, length, config.hidden_size, dtype=torch.float64)
    upstream = torch.randn(batch, length, config.hidden_size, dtype=torch.float64)
    cos, sin = ZebraRotaryEmbedding(config)(hidden, positions)

    x_ref = hidden.clone().requires_grad_()
    out_ref, _ = layer(x_ref, position_embeddings=(cos, sin), attention_mask=block_causal_mask(segments))
    (out_ref * upstream).sum().backward()
    ref_grads = {name: p.grad.clone() for name, p in layer.named_parameters()}
    layer.zero_grad()

    context = build_sequence_parallel_context(layout, segments)
    shard = context.shard
    x = hidden[:, shard].clone().requires_grad_()
    out, _ = layer(x, position_embeddings=(cos[:, shard], sin[:, shard]), sp_context=context)
    (out * upstream[:, shard]).sum().backward()
    param_error = 0.0
    for name, p in layer.named_parameters():
        dist.all_reduce(p.grad, group=layout.group)
        param_error = max(param_error, (p.grad - ref_grads[name]).abs().max().item())
    layer.zero_grad()
    return {
        "mla_out": (out - out_ref[:, shard]).abs().max().item(),
        "mla_dx": (x.grad - x_ref.grad[:, shard]).abs().max().item(),
        "mla_dparams": param_error,
    }


def mixers_worker(rank: int, world: int) -> dict[str, float]:
    from llamafactory_zebra import ZebraConfig
    from llamafactory_zebra.layers.gated_deltanet import ZebraGatedDeltaNet
    from llamafactory_zebra.layers.mla import ZebraMLA

    layout = new_layout(world)
    torch.manual_seed(0)
    results: dict[str, float] = {}

    def keep_worst(found: dict[str, float]) -> None:
        for key, value in found.items():
            results[key] = max(results.get(key, 0.0), value)

    config = ZebraConfig.from_preset("tiny")
    gdn = ZebraGatedDeltaNet(config, layer_idx=1).double()
    for local, rows in LAYOUTS[world]:
        segments = packed_segments(rows)
        assert segments.shape[1] == local * world, (rows, local)
        keep_worst(_gdn_errors(gdn, layout, segments))

    # Zebra's 16 query / 8 key-value heads, and tiny's 4 / 2 (key-value heads replicated at SP 4).
    for heads, kv_heads in ((16, 8), (4, 2)):
        mla_config = ZebraConfig.from_preset("tiny", num_attention_heads=heads, num_key_value_heads=kv_heads)
        mla_config._attn_implementation = "sdpa"
        mla = ZebraMLA(mla_config, layer_idx=0).double()
        local, rows = LAYOUTS[world][0]
        keep_worst(_mla_errors(mla, mla_config, layout, packed_segments(rows)))
        # One sample per row: each row is one segment of the borders sdpa gets.
        keep_worst(_mla_errors(mla, mla_config, layout, packed_segments([[local * world]] * 2)))
    # Every RoPE pairing and MLA norm placement (tiny's default is interleaved + qk_head, covered above).
    local, rows = LAYOUTS[world][0]
    for interleave, norm in ((True, "lora"), (True, "none"), (False, "qk_head"), (False, "lora"), (False, "none")):
        mla_config = ZebraConfig.from_preset("tiny", rope_interleave=interleave, mla_norm=norm)
        mla_config._attn_implementation = "sdpa"
        mla = ZebraMLA(mla_config, layer_idx=0).double()
        keep_worst(_mla_errors(mla, mla_config, layout, packed_segments(rows)))
    return results

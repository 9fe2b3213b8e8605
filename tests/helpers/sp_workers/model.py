"""Per-rank checks of the whole tiny ZebraForCausalLM under sequence parallelism (fp32).

The one-process reference runs each data-parallel group's whole rows; the SP run shards them with
``shard_batch``. Compared: the token-weighted loss of the group (mean of the SP ranks' losses) and
every parameter's gradient (mean over all ranks, as DeepSpeed and DDP reduce them) against the mean
over data-parallel groups of the one-process gradients.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from llamafactory_zebra.parallel import enable_sequence_parallel, new_layout, shard_batch

from .harness import packed_segments, positions_from_segments

# Per SP size: (local length, sample lengths per row) — borders inside shards, on shard borders, a
# 2-token sample across a border, a sample spanning whole shards, padding at the end of a row.
BATCHES = {
    2: (12, [[5, 7, 2, 9, 1], [11, 2, 8, -3]]),
    4: (8, [[3, 5, 9, 2, 13], [7, 2, 6, 1, 1, 12, -3]]),
}


def tiny_model(fused_loss: bool, checkpointing: bool = False):
    from llamafactory_zebra import ZebraConfig, ZebraForCausalLM

    torch.manual_seed(0)
    config = ZebraConfig.from_preset("tiny", vocab_size=97)
    config._attn_implementation = "sdpa"
    model = ZebraForCausalLM(config).float().train()
    if fused_loss:
        model.enable_fused_cross_entropy("chunked")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def make_batch(rows: list[list[int]], seed: int) -> dict[str, torch.Tensor]:
    """Whole packed rows with LLaMA-Factory's packing layout and a masked prompt in every sample."""
    generator = torch.Generator().manual_seed(seed)
    segments = packed_segments(rows)
    input_ids = torch.randint(1, 97, segments.shape, generator=generator)
    labels = input_ids.masked_fill(torch.rand(segments.shape, generator=generator) < 0.3, -100)
    labels = labels.masked_fill(segments == 0, -100)
    return {
        "input_ids": input_ids,
        "attention_mask": (segments != 0).long(),
        "position_ids": positions_from_segments(segments),
        "labels": labels,
    }


def reference_gradients(model, batches: list[dict[str, torch.Tensor]]) -> tuple[list[float], dict[str, torch.Tensor]]:
    losses = []
    for batch in batches:
        loss = model(**batch).loss / len(batches)
        loss.backward()
        losses.append(loss.item() * len(batches))
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    return losses, grads


def sp_errors(model, sp: int, rows: list[list[int]], tag: str) -> dict[str, float]:
    world = dist.get_world_size()
    layout = new_layout(sp)
    batches = [make_batch(rows, seed) for seed in range(layout.dp_size)]
    ref_losses, ref_grads = reference_gradients(model, batches)

    enable_sequence_parallel(model, layout)
    loss = model(**shard_batch(batches[layout.dp_rank], layout)).loss
    loss.backward()
    enable_sequence_parallel(model, None)

    group_loss = loss.detach().clone()
    dist.all_reduce(group_loss, group=layout.group)
    grad_error = grad_scale = 0.0
    for name, p in model.named_parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
        grad_error = max(grad_error, (p.grad - ref_grads[name]).abs().max().item())
        grad_scale = max(grad_scale, ref_grads[name].abs().max().item())
    model.zero_grad()
    return {
        f"{tag}_loss": abs(group_loss.item() / sp - ref_losses[layout.dp_rank]),
        f"{tag}_grads": grad_error,
        f"{tag}_grad_scale": grad_scale,
    }


def model_worker(rank: int, world: int) -> dict[str, float]:
    """Plain and fused cross-entropy; at SP 2 also with gradient checkpointing (the recompute repeats the
    forward collectives, which must line up across ranks)."""
    results = {}
    variants = [(False, False, ""), (True, False, "_fused")] + ([(False, True, "_ckpt")] if world == 2 else [])
    for fused, checkpointing, suffix in variants:
        model = tiny_model(fused, checkpointing)
        results.update(sp_errors(model, world, BATCHES[world][1], f"sp{world}{suffix}"))
        if world == 4:
            results.update(sp_errors(model, 2, BATCHES[2][1], f"sp2xdp2{suffix}"))
    return results

"""Per-rank check of the tiny ZebraForCausalLM with sequence parallelism under DeepSpeed ZeRO-3 (gloo).

Groups come from DeepSpeed's own ``parallel_state_sp`` (passed as ``mpu``); the batch-size rule is
DeepSpeed's ``train_batch_size = micro x grad_accum x world / sp``. The full gradients DeepSpeed
assembles from its ZeRO-3 partitions must equal the one-process gradients averaged over the
data-parallel groups' batches.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from llamafactory_zebra.parallel import enable_sequence_parallel, layout_from_deepspeed, shard_batch

from .model import BATCHES, make_batch, reference_gradients, tiny_model


def zero3_worker(rank: int, world: int, sp: int) -> dict[str, float]:
    import deepspeed
    from deepspeed.utils import safe_get_full_grad

    model = tiny_model(fused_loss=False)
    layout, mpu = layout_from_deepspeed(sp)
    local, rows = BATCHES[sp]
    batches = [make_batch(rows, seed) for seed in range(layout.dp_size)]
    ref_losses, ref_grads = reference_gradients(model, batches)

    enable_sequence_parallel(model, layout)
    micro = len(rows)
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro * world // sp,
        "zero_optimization": {"stage": 3, "reduce_scatter": True},
        "zero_allow_untested_optimizer": True,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, mpu=mpu)
    loss = engine(**shard_batch(batches[layout.dp_rank], layout)).loss
    engine.backward(loss)

    group_loss = loss.detach().clone()
    dist.all_reduce(group_loss, group=layout.group)
    grad_error = grad_scale = 0.0
    for name, p in engine.module.named_parameters():
        full = safe_get_full_grad(p)
        grad_error = max(grad_error, (full.view_as(ref_grads[name]) - ref_grads[name]).abs().max().item())
        grad_scale = max(grad_scale, ref_grads[name].abs().max().item())
    engine.destroy()
    return {
        "zero3_loss": abs(group_loss.item() / sp - ref_losses[layout.dp_rank]),
        "zero3_grads": grad_error,
        "zero3_grad_scale": grad_scale,
    }

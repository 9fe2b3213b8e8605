"""Optimizer steps of a training run, counted as accelerate shards batches and the Trainer groups them.

Two tools need this number before training starts: the warmup guard (a ``warmup_ratio`` that rounds
to zero steps) and ``data inspect``'s report. Neither transformers nor accelerate exposes it without
building the dataloader, so it is written out once here and ``tests/hparams/test_optimizer_steps.py`` checks
it against accelerate's ``prepare_data_loader`` and the Trainer's ``set_initial_training_values``.
"""

from __future__ import annotations

import math


def batches_per_rank(examples: int, per_device_batch_size: int, data_parallel_ranks: int, drop_last: bool) -> int:
    """Batches each data-parallel rank reads in one epoch.

    The sampler first cuts ``examples`` into batches (``drop_last`` drops a short last one);
    accelerate's ``BatchSamplerShard`` deals them out round-robin. With ``drop_last`` every rank stops
    at the last complete round (10 batches on 4 ranks: 2 each); without it ``even_batches`` makes the
    short ranks wrap around to the first batches (3 each).
    """
    batches = examples // per_device_batch_size if drop_last else math.ceil(examples / per_device_batch_size)
    if drop_last:
        return batches // data_parallel_ranks
    return math.ceil(batches / data_parallel_ranks)


def optimizer_steps_per_epoch(
    examples: int,
    per_device_batch_size: int,
    gradient_accumulation_steps: int,
    data_parallel_ranks: int,
    drop_last: bool,
) -> int:
    """Optimizer steps in one epoch; 0 when no rank gets a batch (the Trainer would report 1 and then fail).

    The Trainer rounds a partial accumulation window up: 5 batches with accumulation 2 are 3 steps.
    """
    batches = batches_per_rank(examples, per_device_batch_size, data_parallel_ranks, drop_last)
    if batches == 0:
        return 0
    return math.ceil(batches / gradient_accumulation_steps)


def total_optimizer_steps(steps_per_epoch: int, num_train_epochs: float, max_steps: int) -> int:
    """``max_steps`` when set, else ``ceil(epochs × steps per epoch)`` (fractional epochs round up)."""
    if max_steps > 0:
        return max_steps
    return math.ceil(num_train_epochs * steps_per_epoch)

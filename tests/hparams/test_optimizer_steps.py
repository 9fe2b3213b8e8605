"""Optimizer-step counting against accelerate's batch sharding and the Trainer's own step arithmetic."""

import itertools
from types import SimpleNamespace

import pytest
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader
from transformers import Trainer

from llamafactory_zebra.hparams.optimizer_steps import (
    batches_per_rank,
    optimizer_steps_per_epoch,
    total_optimizer_steps,
)


def _accelerate_batches(examples: int, batch: int, ranks: int, drop_last: bool) -> list[int]:
    loader = DataLoader(list(range(examples)), batch_size=batch, drop_last=drop_last)
    return [
        len(list(prepare_data_loader(loader, num_processes=ranks, process_index=rank, put_on_device=False)))
        for rank in range(ranks)
    ]


def _trainer_steps(len_dataloader: int, accumulation: int, epochs: float) -> tuple[int, int]:
    """(steps per epoch, total steps) from ``Trainer.set_initial_training_values`` itself."""
    args = SimpleNamespace(max_steps=-1, gradient_accumulation_steps=accumulation, num_train_epochs=epochs)
    trainer = SimpleNamespace(
        get_total_train_batch_size=lambda _: 1, get_sp_size=lambda: 1, num_examples=lambda _: len_dataloader
    )
    dataloader = [None] * len_dataloader
    values = Trainer.set_initial_training_values(trainer, args, dataloader)
    return values[1], values[-1]


@pytest.mark.parametrize("drop_last", [True, False])
def test_batches_per_rank_equal_accelerates(drop_last):
    for examples, batch, ranks in itertools.product([1, 7, 10, 33], [1, 3], [1, 2, 4]):
        per_rank = _accelerate_batches(examples, batch, ranks, drop_last)
        assert set(per_rank) == {batches_per_rank(examples, batch, ranks, drop_last)}, (examples, batch, ranks)


def test_the_issue_case_ten_rows_four_ranks_drop_last():
    assert _accelerate_batches(10, 1, 4, True) == [2, 2, 2, 2]
    assert optimizer_steps_per_epoch(10, 1, 1, 4, drop_last=True) == 2
    assert optimizer_steps_per_epoch(10, 1, 1, 4, drop_last=False) == 3


@pytest.mark.parametrize("drop_last", [True, False])
def test_optimizer_steps_equal_the_trainers(drop_last):
    cases = itertools.product([(10, 1, 4), (33, 2, 3), (7, 3, 2), (100, 4, 2)], [(1, 1), (2, 3), (3, 1.5), (4, 0.25)])
    for (examples, batch, ranks), (accumulation, epochs) in cases:
        (len_dataloader,) = set(_accelerate_batches(examples, batch, ranks, drop_last))
        per_epoch, total = _trainer_steps(len_dataloader, accumulation, epochs)
        assert optimizer_steps_per_epoch(examples, batch, accumulation, ranks, drop_last) == per_epoch
        assert total_optimizer_steps(per_epoch, epochs, max_steps=-1) == total


def test_max_steps_wins_and_empty_epochs_have_no_steps():
    assert total_optimizer_steps(5, 3, max_steps=7) == 7
    assert optimizer_steps_per_epoch(3, 4, 1, 2, drop_last=True) == 0

"""Single-process pieces of sequence parallelism: argument handling, errors, sharding, shard borders."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from training_runs import training_run

from llamafactory_zebra.hparams import ZebraArguments, pop_zebra_arguments
from llamafactory_zebra.integration.sequence_parallel import (
    check_sequence_parallel_setup,
    deepspeed_config_for_sequence_parallel,
)
from llamafactory_zebra.parallel import (
    SequenceParallelLayout,
    build_sequence_parallel_context,
    enable_sequence_parallel,
    shard_batch,
)
from llamafactory_zebra.parallel.attention import ulysses_attention
from llamafactory_zebra.parallel.gdn import halo_mask


def layout(rank: int, size: int) -> SequenceParallelLayout:
    return SequenceParallelLayout(group=None, rank=rank, size=size, dp_rank=0, dp_size=1)


@pytest.mark.parametrize(
    ("args", "rest", "size"),
    [
        ({"stage": "sft", "sequence_parallel_size": 4}, {"stage": "sft"}, 4),
        ({"stage": "sft"}, {"stage": "sft"}, 1),
        (["--stage", "sft", "--sequence_parallel_size", "2"], ["--stage", "sft"], 2),
        (["--sequence_parallel_size=8", "--stage=sft"], ["--stage=sft"], 8),
    ],
)
def test_sequence_parallel_key_leaves_the_arguments(args, rest, size):
    remaining, parsed = pop_zebra_arguments(args)
    assert (remaining, parsed.sequence_parallel_size) == (rest, size)


@pytest.mark.parametrize("value", ["two", 0, 1.5, -2, None])
def test_bad_sequence_parallel_size_names_the_key(value):
    with pytest.raises(ValueError, match="sequence_parallel_size must be a positive integer"):
        pop_zebra_arguments({"sequence_parallel_size": value})


def setup(**changes):
    values = {
        "sp": 2,
        "world_size": 4,
        "flash_attn": "sdpa",
        "heads": 4,
        "cutoff_len": 255,
        "packing": True,
        "stage": "sft",
        "model_type": "zebra",
    }
    values.update(changes)
    model_args = SimpleNamespace(model_name_or_path="m", flash_attn=values["flash_attn"])
    data_args = SimpleNamespace(cutoff_len=values["cutoff_len"], packing=values["packing"])
    training_args = SimpleNamespace(
        world_size=values["world_size"], predict_with_generate=False, do_eval=False, do_predict=False
    )
    finetuning_args = SimpleNamespace(stage=values["stage"], compute_accuracy=False, use_dft_loss=False)
    config = SimpleNamespace(model_type=values["model_type"], num_attention_heads=values["heads"])
    zebra = ZebraArguments(sequence_parallel_size=values["sp"])
    return training_run(model_args, data_args, training_args, finetuning_args, config=config, zebra=zebra)


def test_a_sound_setup_passes():
    check_sequence_parallel_setup(setup())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"world_size": 3}, r"sequence_parallel_size=2 does not divide the number of processes \(3\)"),
        ({"flash_attn": "disabled"}, "flash_attn: disabled .eager attention. cannot run"),
        ({"sp": 4, "heads": 6, "world_size": 8, "cutoff_len": 255}, r"must divide the MLA query heads \(6\)"),
        ({"cutoff_len": 256}, "cutoff_len=257 must be a multiple of sequence_parallel_size=2"),
        ({"cutoff_len": 255, "packing": False}, "cutoff_len=255 must be a multiple"),
        ({"model_type": "llama"}, "for Zebra models only"),
        ({"stage": "dpo"}, "supports stage: sft, got stage: dpo"),
    ],
)
def test_bad_setups_are_refused_with_the_fix(changes, message):
    with pytest.raises(ValueError, match=message):
        check_sequence_parallel_setup(setup(**changes))


def test_unsupported_options_are_refused():
    run = setup()
    run.training.predict_with_generate = True
    with pytest.raises(ValueError, match="predict_with_generate: true .generation. is not supported"):
        check_sequence_parallel_setup(run)


def test_train_args_fail_before_any_data_loads(tmp_path, tiny_model_dir):
    """The parser seam refuses SP 2 in a one-process run (LLaMA-Factory loads data only after parsing)."""
    from llamafactory.hparams import get_train_args

    args = {
        "model_name_or_path": str(tiny_model_dir),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "dataset": "does_not_exist",
        "template": "zebra",
        "cutoff_len": 256,
        "output_dir": str(tmp_path / "out"),
        "report_to": "none",
        "sequence_parallel_size": 2,
    }
    with pytest.raises(ValueError, match="does not divide the number of processes"):
        get_train_args(args)


def test_deepspeed_batch_size_counts_data_parallel_ranks_only():
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3, "train_batch_size": 48}
    assert deepspeed_config_for_sequence_parallel(config, dp_size=2)["train_batch_size"] == 12
    auto = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto"}
    assert deepspeed_config_for_sequence_parallel(auto, dp_size=2) == auto


def test_shards_concatenate_to_the_padded_rows_with_labels_shifted_before_cutting():
    input_ids = torch.arange(1, 15).view(2, 7)
    labels = input_ids.masked_fill(input_ids % 3 == 0, -100)
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}
    shards = [shard_batch(batch, layout(rank, 2), pad_token_id=0) for rank in range(2)]
    whole = {key: torch.cat([s[key] for s in shards], dim=1) for key in ("input_ids", "shift_labels", "position_ids")}
    assert shards[0]["input_ids"].shape == (2, 4)
    assert whole["input_ids"][:, :7].equal(input_ids) and whole["input_ids"][:, 7].eq(0).all()
    # The target of shard 0's last token is the first label of shard 1: shifted on whole rows.
    assert shards[0]["shift_labels"][:, -1].equal(labels[:, 4])
    assert whole["shift_labels"][:, :6].equal(labels[:, 1:]) and whole["shift_labels"][:, 6:].eq(-100).all()
    # Padding is its own sample: positions restart, attention mask 0.
    assert whole["position_ids"][:, 7].eq(0).all() and shards[1]["attention_mask"][:, -1].eq(0).all()
    targets = (labels[:, 1:] != -100).sum()
    assert all(s["num_items_in_batch"].item() == targets.item() / 2 for s in shards)


def test_context_finds_samples_that_cross_shard_borders():
    # One row of 12 tokens on 3 ranks (4 each): samples [0, 3) [3, 9) [9, 10) then padding [10, 12).
    segments = torch.tensor([[1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 0, 0]])
    middle = build_sequence_parallel_context(layout(1, 3), segments)
    assert middle.cu_seqlens.tolist() == [0, 4]
    assert middle.continues.tolist() == [True]
    assert middle.continued_tokens.tolist() == [[True, True, True, True]]
    # The 3 tokens before rank 1 are positions 1, 2 (sample 1) and 3 (sample 2): only 3 is its halo.
    assert halo_mask(middle, 3).tolist() == [[False, False, True]]
    last = build_sequence_parallel_context(layout(2, 3), segments)
    assert last.cu_seqlens.tolist() == [0, 1, 2, 4]
    assert last.continued_tokens.tolist() == [[True, False, False, False]]
    assert last.first_run.tolist() == [0] and last.last_run.tolist() == [2]
    first = build_sequence_parallel_context(layout(0, 3), segments)
    assert first.continues.tolist() == [False] and not halo_mask(first, 3).any()


def test_attention_without_a_way_to_separate_samples_is_refused():
    context = build_sequence_parallel_context(layout(0, 2), torch.ones(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="flex_attention.*cannot keep packed samples apart"):
        ulysses_attention(context, lambda *a, **k: None, "flex_attention")
    attend = ulysses_attention(context, lambda *a, **k: None, "sdpa")
    query = torch.zeros(1, 3, 2, 8)
    with pytest.raises(ValueError, match="3 attention heads do not divide by sequence_parallel_size=2"):
        attend(None, query, query, query, None)


def test_model_under_sequence_parallelism_needs_position_ids():
    from llamafactory_zebra.testing.models import tiny_model

    model = tiny_model()
    assert enable_sequence_parallel(model, layout(0, 2)) == 1
    with pytest.raises(ValueError, match="needs the shard's position_ids"):
        model(input_ids=torch.ones(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="implemented for Zebra models"):
        enable_sequence_parallel(nn.Linear(2, 2), layout(0, 2))

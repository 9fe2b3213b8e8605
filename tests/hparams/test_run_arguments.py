"""A run's parsed arguments by name (``hparams.RunArguments``), the one YAML parse the tools share
(``read_run_arguments``), and the parallel size rules written once (``hparams.parallel_sizes``)."""

import pytest

from llamafactory_zebra.hparams import (
    RunArguments,
    ZebraArguments,
    check_sequence_parallel_size,
    data_parallel_size,
    read_run_arguments,
)

YAML = """model_name_or_path: tiny
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 4
dataset: alpaca_en_demo
cutoff_len: 96
output_dir: out
sequence_parallel_size: 2
report_to: none
"""


def test_llamafactorys_tuple_goes_back_unchanged():
    parsed = ("model", "data", "training", "finetuning", "generating")
    run = RunArguments.from_llamafactory(parsed, ZebraArguments())
    assert (run.model, run.data, run.training, run.finetuning, run.generating) == parsed
    assert run.llamafactory_tuple() == parsed
    with pytest.raises(AttributeError):
        run.model = "other"  # frozen


def test_a_yaml_parses_into_named_fields_with_the_plugins_keys(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(YAML)
    values, run = read_run_arguments(path)
    assert values["sequence_parallel_size"] == 2  # the file as read
    assert run.zebra.sequence_parallel_size == 2
    assert (run.model.model_name_or_path, run.data.cutoff_len, run.finetuning.lora_rank) == ("tiny", 96, 4)
    assert run.training.output_dir == "out"
    _, planned = read_run_arguments(path, parse_training=False)  # the planner: no machine checks
    assert planned.training is None and planned.finetuning.finetuning_type == "lora"


def test_a_bad_key_value_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(YAML.replace("sequence_parallel_size: 2", "sequence_parallel_size: 0"))
    with pytest.raises(ValueError, match=r"train\.yaml: sequence_parallel_size must be a positive integer, got 0"):
        read_run_arguments(path)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2", None])
def test_sequence_parallel_size_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match="sequence_parallel_size must be a positive integer"):
        check_sequence_parallel_size(value)


def test_sequence_parallel_size_must_divide_the_processes_and_names_the_valid_sizes():
    check_sequence_parallel_size(4, 8)
    with pytest.raises(
        ValueError,
        match=r"sequence_parallel_size=3 does not divide the number of processes \(8\); use one of \[1, 2, 4, 8\]",
    ):
        check_sequence_parallel_size(3, 8)


def test_data_parallel_size_is_processes_over_sequence_parallel_size():
    assert data_parallel_size(8, 2) == 4
    assert data_parallel_size(None, 4) == 1  # one sequence-parallel group
    with pytest.raises(ValueError, match="does not divide"):
        data_parallel_size(6, 4)

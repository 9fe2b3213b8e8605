"""The plugin's YAML keys: one dataclass, parsed with ``HfArgumentParser`` from a YAML mapping or CLI strings."""

import dataclasses

import pytest
from repo_paths import DOCS

from llamafactory_zebra.hparams import ZebraArguments, pop_zebra_arguments, zebra_arguments
from llamafactory_zebra.hparams.zebra_args import KEYS


def test_no_plugin_key_gives_every_default_and_leaves_the_rest_alone():
    rest, parsed = pop_zebra_arguments({"stage": "sft", "cutoff_len": 128})
    assert rest == {"stage": "sft", "cutoff_len": 128} and parsed == ZebraArguments()
    assert zebra_arguments(object()) == ZebraArguments()


def test_mapping_and_command_line_parse_to_the_same_arguments():
    mapping = {"stage": "sft", "distill": "kd", "teacher_model_name_or_path": "t", "kd_temperature": 2.0,
               "kd_reverse_kl": True, "ild_layers": [3, 0, 3]}  # fmt: skip
    strings = ["--stage", "sft", "--distill", "kd", "--teacher_model_name_or_path=t", "--kd_temperature", "2",
               "--kd_reverse_kl", "--ild_layers", "0,3"]  # fmt: skip
    (rest_map, from_map), (rest_cli, from_cli) = pop_zebra_arguments(mapping), pop_zebra_arguments(strings)
    assert from_map == from_cli and from_map.ild_layers == [0, 3] and from_map.kd_reverse_kl
    assert rest_map == {"stage": "sft"} and rest_cli == ["--stage", "sft"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tiled_mlp": "yes please"}, "tiled_mlp must be true or false, got 'yes please'"),
        ({"kd_temperature": "hot", "distill": "kd"}, "kd_temperature must be a number, got 'hot'"),
        ({"kd_reverse_kl": 1, "distill": "kd"}, "kd_reverse_kl must be true or false, got 1"),
        ({"sequence_parallel_size": True}, "sequence_parallel_size must be a positive integer, got True"),
        ({"ild_loss": "l1", "distill": "ild"}, "ild_loss must be one of l2, mse, got 'l1'"),
        ({"teacher_model_name_or_path": 7, "distill": "kd"}, "teacher_model_name_or_path must be a string, got 7"),
        ({"ild_layers": "0,x", "distill": "ild"}, "ild_layers must be 'all' or layer indices like 0,3,5"),
        ({"kd_temperature": 2.0}, "kd_temperature need distill: ild or distill: kd"),
    ],
)
def test_bad_values_name_the_key_and_what_is_valid(values, message):
    with pytest.raises(ValueError, match=message):
        pop_zebra_arguments(values)


def test_help_and_lookalike_options_stay_with_llamafactory():
    args = ["--help", "--tiled", "true", "--dataset", "kd_temperature"]
    assert pop_zebra_arguments(args) == (args, ZebraArguments())


def test_bad_command_line_values_name_the_key():
    with pytest.raises(ValueError, match="sequence_parallel_size.*invalid int value: 'two'"):
        pop_zebra_arguments(["--sequence_parallel_size", "two"])
    with pytest.raises(ValueError, match="ild_layers need distill"):
        pop_zebra_arguments(["--ild_layers=0,1"])


def test_every_key_is_documented_with_its_parser_home():
    """Each key appears in the docs as a backticked name, and each field has help text for ``--help``."""
    docs = "".join((DOCS / name).read_text(encoding="utf-8") for name in ("distill.md", "sequence-parallel.md"))
    assert [key for key in KEYS if f"`{key}`" not in docs] == []
    assert all(f.metadata.get("help") for f in dataclasses.fields(ZebraArguments) if f.init)

from types import SimpleNamespace

import pytest
from training_runs import training_run

from llamafactory_zebra.hparams import pop_zebra_arguments
from llamafactory_zebra.integration.tiled_mlp import check_tiled_mlp_setup


def pop_tiled_mlp(args):
    rest, parsed = pop_zebra_arguments(args)
    return rest, parsed.tiled_mlp


def test_tiled_mlp_key_leaves_the_arguments_llamafactory_parses():
    assert pop_tiled_mlp({"stage": "sft", "tiled_mlp": True}) == ({"stage": "sft"}, True)
    assert pop_tiled_mlp(["--stage", "sft", "--tiled_mlp", "false"]) == (["--stage", "sft"], False)
    assert pop_tiled_mlp(["--tiled_mlp=true"]) == ([], True)
    assert pop_tiled_mlp({"stage": "sft"}) == ({"stage": "sft"}, False)


def test_tiled_mlp_key_rejects_non_booleans():
    with pytest.raises(ValueError, match="tiled_mlp must be true or false"):
        pop_tiled_mlp({"tiled_mlp": 4})


def test_tiled_mlp_refuses_plain_ddp_and_other_models(tmp_path, tiny_model_dir):
    zebra = tiny_model_dir
    with pytest.raises(ValueError, match="needs DeepSpeed"):
        check_tiled_mlp_setup(_run(zebra, world_size=2, deepspeed=None))
    check_tiled_mlp_setup(_run(zebra, world_size=2, deepspeed="ds.json"))
    with pytest.raises(ValueError, match="implemented for Zebra models"):
        check_tiled_mlp_setup(_run(tmp_path, world_size=1, deepspeed=None))


def _run(model_path, **training):
    return training_run(SimpleNamespace(model_name_or_path=str(model_path)), training=SimpleNamespace(**training))

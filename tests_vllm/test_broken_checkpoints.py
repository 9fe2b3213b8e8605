"""A checkpoint with a missing, an extra or a mis-shaped weight stops the engine at load, naming the key."""

import pytest
from safetensors.torch import load_file, save_file

from llamafactory_zebra.configuration_zebra import ZebraConfig
from llamafactory_zebra.modeling_zebra import ZebraForCausalLM
from llamafactory_zebra.testing.vllm_parity import load_failures

pytestmark = pytest.mark.slow


def broken_checkpoint(path, edit):
    ZebraForCausalLM(ZebraConfig.from_preset("tiny")).save_pretrained(path)
    weights = load_file(path / "model.safetensors")
    edit(weights)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def add_extra(weights):
    weights["model.layers.0.gdn.extra_proj.weight"] = weights["model.layers.0.gdn.o_proj.weight"].clone()


def truncate_conv(weights):
    weights["model.layers.2.gdn.q_conv1d.weight"] = weights["model.layers.2.gdn.q_conv1d.weight"][:-1].clone()


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    paths = [
        broken_checkpoint(tmp_path_factory.mktemp("missing"), lambda w: w.pop("model.layers.1.mla.kv_b_proj.weight")),
        broken_checkpoint(tmp_path_factory.mktemp("extra"), add_extra),
        broken_checkpoint(tmp_path_factory.mktemp("misshaped"), truncate_conv),
    ]
    return load_failures(paths)


def test_missing_weight_is_named(refusals):
    assert refusals[0].startswith("REFUSED")
    assert "missing 1 weight(s) this Zebra config needs: model.layers.1.mla.kv_b_proj.weight" in refusals[0]


def test_extra_weight_is_named(refusals):
    assert refusals[1].startswith("REFUSED")
    assert "'model.layers.0.gdn.extra_proj.weight' is not part of this Zebra model" in refusals[1]


def test_misshaped_weight_is_named(refusals):
    assert refusals[2].startswith("REFUSED")
    assert "'model.layers.2.gdn.q_conv1d.weight' has shape (63, 1, 4)" in refusals[2]

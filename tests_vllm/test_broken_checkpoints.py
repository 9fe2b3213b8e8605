"""A checkpoint with a missing, an extra or a mis-shaped weight stops the engine at load, naming the key."""

import pytest
from safetensors.torch import load_file, save_file
from vllm_parity import load_failure

from llamafactory_zebra.configuration_zebra import ZebraConfig
from llamafactory_zebra.modeling_zebra import ZebraForCausalLM

pytestmark = pytest.mark.slow


def broken_checkpoint(path, edit) -> None:
    ZebraForCausalLM(ZebraConfig.from_preset("tiny")).save_pretrained(path)
    weights = load_file(path / "model.safetensors")
    edit(weights)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_missing_weight_is_named(tmp_path):
    broken_checkpoint(tmp_path, lambda w: w.pop("model.layers.1.mla.kv_b_proj.weight"))
    output = load_failure(tmp_path)
    assert "missing" in output and "model.layers.1.mla.kv_b_proj.weight" in output


def test_extra_weight_is_named(tmp_path):
    def add(weights):
        weights["model.layers.0.gdn.extra_proj.weight"] = weights["model.layers.0.gdn.o_proj.weight"].clone()

    broken_checkpoint(tmp_path, add)
    output = load_failure(tmp_path)
    assert "'model.layers.0.gdn.extra_proj.weight' is not part of this Zebra model" in output


def test_misshaped_weight_is_named(tmp_path):
    def truncate(weights):
        weights["model.layers.2.gdn.q_conv1d.weight"] = weights["model.layers.2.gdn.q_conv1d.weight"][:-1].clone()

    broken_checkpoint(tmp_path, truncate)
    output = load_failure(tmp_path)
    assert "'model.layers.2.gdn.q_conv1d.weight' has shape (63, 1, 4)" in output

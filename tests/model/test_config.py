import argparse
import json

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError

from llamafactory_zebra import ZebraConfig, ZebraForCausalLM
from llamafactory_zebra.presets import PRESETS


@pytest.mark.parametrize(
    ("preset", "expected"),
    [("qwen3-1.7b-7mla21gdn-1m", 2_284_173_820), ("qwen3-1.7b-14mla14gdn", 2_182_902_440)],
)
def test_released_presets_have_the_published_parameter_counts(preset, expected):
    with torch.device("meta"):
        model = ZebraForCausalLM(ZebraConfig.from_preset(preset))
    assert sum(p.numel() for p in model.parameters()) == expected


def test_gdn_layer_has_the_reference_parameter_count():
    with torch.device("meta"):
        model = ZebraForCausalLM(ZebraConfig.from_preset("qwen3-1.7b-7mla21gdn-1m"))
    assert sum(p.numel() for p in model.model.layers[0].gdn.parameters()) == 25_215_500


def test_layer_plans_of_the_presets():
    assert ZebraConfig.from_preset("qwen3-1.7b-7mla21gdn-1m").mla_layers == [1, 5, 9, 13, 17, 21, 25]
    assert ZebraConfig.from_preset("qwen3-1.7b-14mla14gdn").mla_layers == list(range(0, 28, 2))
    tiny = ZebraConfig.from_preset("tiny")
    assert set(tiny.layer_types) == {"mla", "gdn"}


def test_1m_preset_rope_is_yarn_32_over_32k():
    config = ZebraConfig.from_preset("qwen3-1.7b-7mla21gdn-1m")
    assert config.max_position_embeddings == 1_048_576
    assert config.rope_parameters["rope_type"] == "yarn"
    assert config.rope_parameters["factor"] == 32.0
    assert config.rope_parameters["original_max_position_embeddings"] == 32768
    assert config.rope_parameters["rope_theta"] == 1_000_000.0


def test_state_dict_keys_follow_the_released_layout():
    with torch.device("meta"):
        model = ZebraForCausalLM(ZebraConfig.from_preset("qwen3-1.7b-7mla21gdn-1m"))
    keys = set(model.state_dict())
    mla = {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "q_norm", "k_norm", "kv_b_proj", "out_proj"}
    gdn = {"q_proj", "k_proj", "v_proj", "a_proj", "b_proj", "g_proj", "o_norm", "o_proj"}
    gdn |= {"q_conv1d", "k_conv1d", "v_conv1d"}
    for i in range(28):
        mixer, names = ("mla", mla) if i % 4 == 1 else ("gdn", gdn)
        for name in names:
            assert f"model.layers.{i}.{mixer}.{name}.weight" in keys
        for name in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"):
            assert f"model.layers.{i}.{name}.weight" in keys
    assert "model.layers.0.gdn.A_log" in keys and "model.layers.0.gdn.dt_bias" in keys
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} <= keys
    assert model.lm_head.weight is not model.model.embed_tokens.weight


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="tiny"):
        ZebraConfig.from_preset("qwen4")
    with pytest.raises(ValueError, match="also with a hylo- or zebra- prefix"):
        ZebraConfig.from_preset("hylo-qwen4")


@pytest.mark.parametrize(
    "name", ["HyLo-Qwen3-1.7B-7MLA21GDN-64K", "hylo_qwen3_1.7b_7mla21gdn_64k", "amd/HyLo-Qwen-7MLA21GDN-64K"]
)
def test_amds_hylo_names_are_the_presets(name, tmp_path):
    """AMD's tooling calls the models HyLo: the names a user types for a preset, the planner and ``init``."""
    from llamafactory_zebra.cli.init_cmd import run
    from llamafactory_zebra.planning.yaml_setup import resolve_model_config

    assert ZebraConfig.from_preset(name).to_dict() == ZebraConfig.from_preset("qwen3-1.7b-7mla21gdn-64k").to_dict()
    config, where = resolve_model_config(name)
    assert where.endswith("(preset qwen3-1.7b-7mla21gdn-64k)") and config.max_position_embeddings == 65_536
    args = argparse.Namespace(preset="HyLo-Tiny", output_dir=str(tmp_path), overwrite=False, allow_large=False)
    assert run(argparse.Namespace(**vars(args), seed=0, dtype="float32")) == 0
    assert (tmp_path / "config.json").is_file()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"mla_layers": [1, 9]}, "mla_layers"),
        ({"layer_types": ["mla", "attention", "gdn", "gdn"]}, "layer_types"),
        ({"layer_types": ["mla", "gdn"]}, "layer_types"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 0.5}}, "rope_parameters"),
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": -1}},
            "rope_parameters",
        ),
        (
            {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 1e6,
                    "factor": "big",
                    "original_max_position_embeddings": 8,
                }
            },
            "rope_parameters",
        ),
        ({"rope_parameters": {"rope_type": "ntk-by-parts", "rope_theta": 1e6}}, "rope_parameters"),
        (
            {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 1e6,
                    "factor": 2.0,
                    "original_max_position_embeddings": 8,
                    "mscale": "1",
                }
            },
            "rope_parameters",
        ),
        ({"qk_rope_head_dim": 15}, "qk_rope_head_dim"),
        ({"gdn_head_dim": 0}, "gdn_head_dim"),
        ({"gdn_conv_size": 1}, "gdn_conv_size"),
    ],
)
def test_invalid_configs_name_the_field(overrides, field):
    # Checks that run in @strict's validate_* hooks reach the caller wrapped in its error, message intact.
    with pytest.raises((ValueError, StrictDataclassError), match=f"ZebraConfig.{field}"):
        ZebraConfig.from_preset("tiny", **overrides)


def test_mla_layers_keyword_builds_the_plan():
    config = ZebraConfig.from_preset("tiny", mla_layers=[0, 3])
    assert config.layer_types == ["mla", "gdn", "gdn", "mla"]


def test_config_round_trip(tmp_path):
    config = ZebraConfig.from_preset("qwen3-1.7b-7mla21gdn-1m")
    config.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "zebra"
    loaded = ZebraConfig.from_pretrained(tmp_path)
    assert loaded.layer_types == config.layer_types
    assert loaded.rope_parameters == config.rope_parameters


def test_every_preset_builds():
    for name in PRESETS:
        ZebraConfig.from_preset(name)


def test_base_config_class_accepts_a_zebra_config_json(tmp_path):
    """transformers' Trainer reads a checkpoint's config.json through PreTrainedConfig when resuming."""
    from transformers import PreTrainedConfig

    ZebraConfig.from_preset("tiny").save_pretrained(tmp_path)
    # The plan is stored as layers_block_type (see ZebraConfig's docstring); the base class reads it as-is.
    config = PreTrainedConfig.from_json_file(str(tmp_path / "config.json"))
    assert config.layers_block_type == ["gdn", "mla", "gdn", "gdn"]


GLOBALS_PROBE = """
import json, sys
import transformers.configuration_utils as configuration_utils
import transformers.modeling_rope_utils as modeling_rope_utils

def snapshot():
    return {
        module.__name__ + "." + name: repr(value)
        for module in (configuration_utils, modeling_rope_utils)
        for name, value in vars(module).items()
        if not name.startswith("__") and isinstance(value, (tuple, list, dict, set, frozenset, str, int, float))
    }

before = snapshot()
import llamafactory_zebra
llamafactory_zebra.ZebraConfig.from_preset("tiny")
after = snapshot()
print(json.dumps({key: [before.get(key), after.get(key)] for key in before.keys() | after.keys()
                  if before.get(key) != after.get(key)}))
"""


@pytest.mark.slow
def test_importing_the_plugin_leaves_transformers_module_globals_alone():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", GLOBALS_PROBE], capture_output=True, text=True, check=True)
    changed = json.loads(result.stdout.strip().splitlines()[-1])
    assert changed == {}
    from transformers import configuration_utils

    assert (
        "mla" not in configuration_utils.ALLOWED_LAYER_TYPES and "gdn" not in configuration_utils.ALLOWED_LAYER_TYPES
    )


def test_preset_module_examples_run():
    import doctest

    from llamafactory_zebra import presets

    results = doctest.testmod(presets)
    assert results.attempted >= 2 and results.failed == 0

"""The parameter inventory (``inventory.py``): the names and shapes every tool checks weights against are
those of a real model, for every MLA norm placement and option, and the one name list written below the
model (``released.keys.mla_weight_names``) agrees with it."""

import pytest

from llamafactory_zebra import ZebraForCausalLM
from llamafactory_zebra.configuration_zebra import MLA_NORMS
from llamafactory_zebra.inventory import meta_gdn_mixer, meta_model, parameter_names, parameter_shapes
from llamafactory_zebra.layers.gated_deltanet import ZebraGatedDeltaNet
from llamafactory_zebra.released.keys import mla_weight_names
from llamafactory_zebra.testing.models import tiny_config

VARIANTS = [
    {},
    {"q_lora_rank": None},
    {"attention_bias": True},
    {"tie_word_embeddings": True},
    {"mla_layers": [0, 2], "num_hidden_layers": 3},
]


@pytest.mark.parametrize("norm", MLA_NORMS)
@pytest.mark.parametrize("overrides", VARIANTS, ids=str)
def test_shapes_are_those_of_a_materialised_model(norm, overrides):
    config = tiny_config(mla_norm=norm, **overrides)
    real = {name: tuple(t.shape) for name, t in ZebraForCausalLM(config).state_dict().items()}
    assert parameter_shapes(config) == real
    assert parameter_names(config) == set(real)


def test_meta_model_allocates_nothing_and_the_cache_is_not_shared_by_reference():
    config = tiny_config()
    assert all(p.device.type == "meta" for p in meta_model(config).parameters())
    shapes = parameter_shapes(config)
    shapes.clear()
    assert parameter_shapes(config)  # a caller's edit does not reach the cache


def test_a_gdn_mixer_can_be_built_where_the_plan_has_mla():
    config = tiny_config()
    mixer = meta_gdn_mixer(config, config.mla_layers[0])
    assert isinstance(mixer, ZebraGatedDeltaNet) and next(mixer.parameters()).device.type == "meta"


@pytest.mark.parametrize("norm", MLA_NORMS)
@pytest.mark.parametrize("overrides", VARIANTS[:3], ids=str)
def test_released_key_detection_lists_the_inventorys_mla_names(norm, overrides):
    config = tiny_config(mla_norm=norm, **overrides)
    index = config.mla_layers[0]
    prefix = f"model.layers.{index}.mla."
    from_model = {name[len(prefix) :] for name in parameter_names(config) if name.startswith(prefix)}
    assert mla_weight_names(config, norm) == from_model

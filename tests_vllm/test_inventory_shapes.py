"""The vLLM loader's expected checkpoint (``serving/vllm/model.py``'s ``checkpoint_shapes``) is the
parameter inventory's (``inventory.parameter_shapes``, read off the transformers model), for every MLA
norm placement and option: a layer change that the serving table misses fails here, without an engine."""

import pytest
from vllm_parity import RELEASED_HEADS_SMALL

from llamafactory_zebra.configuration_zebra import MLA_NORMS, ZebraConfig
from llamafactory_zebra.inventory import parameter_shapes
from llamafactory_zebra.serving.vllm.model import checkpoint_shapes


@pytest.mark.parametrize("norm", MLA_NORMS)
@pytest.mark.parametrize("overrides", [{}, {"q_lora_rank": None}, {"attention_bias": True}], ids=str)
def test_the_vllm_loader_expects_the_inventorys_names_and_shapes(norm, overrides):
    config = ZebraConfig(**{**RELEASED_HEADS_SMALL, "mla_norm": norm, **overrides})
    assert checkpoint_shapes(config) == parameter_shapes(config)

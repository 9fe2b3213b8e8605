"""MLA's softmax scale (``rope.py``) against independent computations, and its one use by the MLA layer."""

import math
from decimal import Decimal, getcontext

import pytest
import torch
from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_get_mscale

from llamafactory_zebra.layers.mla import ZebraMLA
from llamafactory_zebra.rope import mla_softmax_scale, yarn_softmax_mscale
from llamafactory_zebra.testing.models import tiny_config

YARN = {"rope_type": "yarn", "rope_theta": 1e6, "original_max_position_embeddings": 64}


def decimal_scale(qk_head_dim: int, factor: float, mscale_all_dim: float) -> float:
    """``qk^-1/2 (0.1 m ln s + 1)^2`` in 40-digit decimal arithmetic, rounded once to a float."""
    getcontext().prec = 40
    mscale = Decimal("0.1") * Decimal(mscale_all_dim) * Decimal(factor).ln() + 1
    return float(mscale * mscale / Decimal(qk_head_dim).sqrt())


@pytest.mark.parametrize(("factor", "mscale_all_dim"), [(32.0, 0.707), (4.0, 1.0), (2.5, 0.8), (40.0, 0.3)])
def test_scale_equals_a_decimal_computation_and_transformers_deepseek(factor, mscale_all_dim):
    config = tiny_config(rope_parameters={**YARN, "factor": factor, "mscale": 1.0, "mscale_all_dim": mscale_all_dim})
    scale = mla_softmax_scale(config)
    assert scale == pytest.approx(decimal_scale(config.qk_head_dim, factor, mscale_all_dim), rel=1e-15)
    deepseek = config.qk_head_dim**-0.5 * yarn_get_mscale(factor, mscale_all_dim) ** 2
    assert scale == pytest.approx(deepseek, rel=1e-15)


def test_float64_value_differs_from_the_former_fp32_log_only_in_fp32_rounding():
    """The training layer used to take ``ln(factor)`` through an fp32 ``torch.log``; the float64 value
    moves by less than fp32's resolution, so no result computed in fp32 or bf16 can tell them apart."""
    factor, mscale_all_dim = 32.0, 0.707
    config = tiny_config(rope_parameters={**YARN, "factor": factor, "mscale": 1.0, "mscale_all_dim": mscale_all_dim})
    former = (0.1 * mscale_all_dim * torch.log(torch.tensor(factor)).item() + 1.0) ** 2
    assert yarn_softmax_mscale(config) == pytest.approx(former, rel=torch.finfo(torch.float32).eps)


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 1e6},
        {**YARN, "factor": 32.0},
        {**YARN, "factor": 1.0, "mscale_all_dim": 0.707},
        {"rope_type": "linear", "rope_theta": 1e6, "factor": 4.0, "mscale_all_dim": 0.707},
    ],
    ids=["default", "yarn-without-mscale_all_dim", "yarn-factor-1", "linear"],
)
def test_no_correction_without_yarn_mscale_all_dim(rope):
    config = tiny_config(rope_parameters=rope)
    assert yarn_softmax_mscale(config) == 1.0
    assert mla_softmax_scale(config) == config.qk_head_dim**-0.5


def test_training_layer_takes_its_scale_from_rope():
    config = tiny_config(rope_parameters={**YARN, "factor": 32.0, "mscale": 0.707, "mscale_all_dim": 0.707})
    assert ZebraMLA(config, 1).scaling == mla_softmax_scale(config)
    assert mla_softmax_scale(config) == pytest.approx(
        (0.1 * 0.707 * math.log(32.0) + 1.0) ** 2 / math.sqrt(config.qk_head_dim), rel=1e-15
    )

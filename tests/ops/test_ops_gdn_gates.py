"""The GDN gates (``ops.gdn_gates``) against the plain formula in fp64, their dtypes and gradients."""

import math

import pytest
import torch

from llamafactory_zebra.layers.gated_deltanet import ZebraGatedDeltaNet
from llamafactory_zebra.ops import gdn_gates


def gate_inputs(shape=(2, 5, 3), dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    heads = shape[-1]
    a = torch.randn(shape, generator=gen, dtype=torch.float64) * 3
    b = torch.randn(shape, generator=gen, dtype=torch.float64) * 3
    A_log = torch.rand(heads, generator=gen, dtype=torch.float64).mul(16).log()
    dt_bias = torch.randn(heads, generator=gen, dtype=torch.float64)
    return tuple(t.to(dtype) for t in (a, b, A_log, dt_bias))


def plain_gates(a, b, A_log, dt_bias):
    """Element by element in Python floats: beta = 1/(1+e^-b), g = -e^A_log ln(1 + e^(a + dt_bias))."""
    g = torch.empty_like(a, dtype=torch.float64)
    beta = torch.empty_like(b, dtype=torch.float64)
    for index in torch.cartesian_prod(*(torch.arange(n) for n in a.shape)).tolist():
        head = index[-1]
        x = a[tuple(index)].item() + dt_bias[head].item()
        g[tuple(index)] = -math.exp(A_log[head].item()) * math.log1p(math.exp(x))
        beta[tuple(index)] = 1.0 / (1.0 + math.exp(-b[tuple(index)].item()))
    return g, beta


def test_gates_equal_the_plain_formula_in_fp64():
    inputs = gate_inputs()
    g, beta = gdn_gates(*inputs)
    expected_g, expected_beta = plain_gates(*inputs)
    assert g.dtype == beta.dtype == torch.float64
    torch.testing.assert_close(g, expected_g, rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(beta, expected_beta, rtol=1e-13, atol=1e-14)
    assert (g <= 0).all() and ((beta > 0) & (beta < 1)).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_decay_is_computed_in_fp32_and_beta_keeps_b_dtype(dtype):
    """bf16/fp16 projections: ``g`` in fp32 from the same (rounded) inputs, as the fp64 formula gives it."""
    a, b, A_log, dt_bias = gate_inputs(dtype=dtype)
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    assert g.dtype == torch.float32 and beta.dtype == dtype
    expected_g, expected_beta = plain_gates(a.double(), b.double(), A_log.double(), dt_bias.double())
    torch.testing.assert_close(g.double(), expected_g, rtol=1e-5, atol=1e-6)
    resolution = torch.finfo(dtype).eps
    torch.testing.assert_close(beta.double(), expected_beta, rtol=resolution, atol=resolution)


def test_gradients_match_finite_differences():
    inputs = tuple(t.clone().requires_grad_() for t in gate_inputs(shape=(2, 3)))
    assert torch.autograd.gradcheck(lambda *xs: gdn_gates(*xs), inputs)


def test_training_layer_feeds_these_gates_to_the_rule(monkeypatch):
    """The GDN layer hands exactly ``gdn_gates`` of its projections to the recurrence (its only gate formula)."""
    import llamafactory_zebra.layers.gated_deltanet as layer_module
    from llamafactory_zebra.testing.models import tiny_config

    config = tiny_config()
    layer = ZebraGatedDeltaNet(config, 0).double()
    x = torch.randn(1, 4, config.hidden_size, dtype=torch.float64)
    seen = {}

    def recording_rule(q, k, v, *, g, beta, **options):
        seen["g"], seen["beta"] = g, beta
        return torch.zeros(*v.shape, dtype=v.dtype), None

    monkeypatch.setattr(layer_module, "chunk_gated_delta_rule", recording_rule)
    layer(x)
    expected_g, expected_beta = plain_gates(layer.a_proj(x), layer.b_proj(x), layer.A_log, layer.dt_bias)
    torch.testing.assert_close(seen["g"], expected_g, rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(seen["beta"], expected_beta, rtol=1e-13, atol=1e-14)

"""MLA against an explicit, loop-per-head attention written from the architecture description."""

import math

import pytest
import torch
from zebra_helpers import tiny_config

from llamafactory_zebra.layers.mla import ZebraMLA, yarn_softmax_mscale
from llamafactory_zebra.modeling_zebra import ZebraRotaryEmbedding


def rotate(x, positions, dim, theta):
    """Half-split RoPE from first principles: pair channel i with channel i + dim/2."""
    half = dim // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / dim)
    angles = positions[:, None].double() * freqs[None]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def naive_mla(layer: ZebraMLA, x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    cfg = layer.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    nope, rope, vdim, rank = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    batch, length, _ = x.shape
    out = torch.zeros(batch, length, heads * vdim, dtype=x.dtype)
    for b in range(batch):
        q = (x[b] @ layer.q_a_proj.weight.T @ layer.q_b_proj.weight.T).view(length, heads, nope + rope)
        compressed = x[b] @ layer.kv_a_proj_with_mqa.weight.T
        latent = compressed[:, :rank]
        latent = latent / torch.sqrt(latent.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)
        latent = latent * layer.kv_a_layernorm.weight
        rope_key = rotate(compressed[:, rank:], positions[b], rope, theta)
        kv = (latent @ layer.kv_b_proj.weight.T).view(length, kv_heads, nope + vdim)
        for h in range(heads):
            g = h // (heads // kv_heads)
            q_h = torch.cat([q[:, h, :nope], rotate(q[:, h, nope:], positions[b], rope, theta)], dim=-1)
            k_h = torch.cat([kv[:, g, :nope], rope_key], dim=-1)
            v_h = kv[:, g, nope:]
            for t in range(length):
                scores = (k_h[: t + 1] @ q_h[t]) / math.sqrt(nope + rope)
                out[b, t, h * vdim : (h + 1) * vdim] = torch.softmax(scores, dim=0) @ v_h[: t + 1]
    return out @ layer.out_proj.weight.T


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_mla_matches_explicit_attention(attn_implementation):
    config = tiny_config()
    config._attn_implementation = attn_implementation
    layer = ZebraMLA(config, layer_idx=1).double()
    rotary = ZebraRotaryEmbedding(config)
    x = torch.randn(2, 11, config.hidden_size, dtype=torch.float64)
    positions = torch.stack([torch.arange(11), torch.arange(5, 16)])
    from llamafactory_zebra.modeling_zebra import block_causal_mask

    mask = block_causal_mask(torch.ones(2, 11, dtype=torch.long))
    cos, sin = rotary(x, positions)
    ours = layer(x, position_embeddings=(cos, sin), attention_mask=mask)
    reference = naive_mla(layer, x, positions, config.rope_parameters["rope_theta"])
    # RoPE angles are computed in fp32 (as in transformers), the rest in fp64.
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)


def test_mla_gradients_match_explicit_attention():
    config = tiny_config()
    layer = ZebraMLA(config, layer_idx=1).double()
    rotary = ZebraRotaryEmbedding(config)
    x = torch.randn(1, 7, config.hidden_size, dtype=torch.float64, requires_grad=True)
    positions = torch.arange(7)[None]
    from llamafactory_zebra.modeling_zebra import block_causal_mask

    ours = layer(x, position_embeddings=rotary(x, positions), attention_mask=block_causal_mask(torch.ones(1, 7)))
    grads = torch.autograd.grad(ours.square().sum(), [x, *layer.parameters()])
    reference = naive_mla(layer, x, positions, config.rope_parameters["rope_theta"])
    expected = torch.autograd.grad(reference.square().sum(), [x, *layer.parameters()])
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_yarn_mscale_all_dim_scales_the_softmax():
    rope = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 32.0, "original_max_position_embeddings": 64}
    plain = tiny_config(rope_parameters=dict(rope))
    with_mscale = tiny_config(rope_parameters={**rope, "mscale": 0.707, "mscale_all_dim": 0.707})
    assert yarn_softmax_mscale(plain) == 1.0
    expected = (0.1 * 0.707 * math.log(32.0) + 1.0) ** 2
    assert yarn_softmax_mscale(with_mscale) == pytest.approx(expected)
    layer = ZebraMLA(with_mscale, 1)
    assert layer.scaling == pytest.approx(expected / math.sqrt(with_mscale.qk_head_dim))


def test_yarn_changes_only_long_wavelength_rope_dims():
    rope = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 32.0, "original_max_position_embeddings": 64}
    default = ZebraRotaryEmbedding(tiny_config())
    yarn = ZebraRotaryEmbedding(tiny_config(rope_parameters=rope))
    assert yarn.inv_freq.shape == default.inv_freq.shape == (tiny_config().qk_rope_head_dim // 2,)
    assert torch.allclose(yarn.inv_freq[0], default.inv_freq[0])
    assert yarn.inv_freq[-1] < default.inv_freq[-1]
    assert yarn.attention_scaling == pytest.approx(0.1 * math.log(32.0) + 1.0)

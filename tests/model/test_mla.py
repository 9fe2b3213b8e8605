"""MLA against an explicit, loop-per-head attention written from the architecture description."""

import math

import pytest
import torch

from llamafactory_zebra.layers.mla import ZebraMLA
from llamafactory_zebra.modeling_zebra import ZebraRotaryEmbedding
from llamafactory_zebra.packing import block_causal_mask
from llamafactory_zebra.rope import yarn_softmax_mscale
from llamafactory_zebra.testing.models import tiny_config

VARIANTS = [(interleave, norm) for interleave in (True, False) for norm in ("qk_head", "lora", "none")]


def rotate(x, positions, dim, theta, interleave):
    """RoPE from first principles: channel pairs (2j, 2j+1) when interleaved, else (j, j + dim/2)."""
    half = dim // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / dim)
    angles = positions[:, None].double() * freqs[None]
    cos, sin = angles.cos(), angles.sin()
    first, second = (x[..., 0::2], x[..., 1::2]) if interleave else (x[..., :half], x[..., half:])
    rotated = (first * cos - second * sin, second * cos + first * sin)
    return torch.stack(rotated, dim=-1).flatten(-2) if interleave else torch.cat(rotated, dim=-1)


def rms(x, weight, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def naive_mla(layer: ZebraMLA, x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    cfg = layer.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    nope, rope, vdim, rank = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    eps, norm, interleave = cfg.rms_norm_eps, cfg.mla_norm, cfg.rope_interleave
    batch, length, _ = x.shape
    out = torch.zeros(batch, length, heads * vdim, dtype=x.dtype)
    for b in range(batch):
        q = x[b] @ layer.q_a_proj.weight.T
        if norm == "lora":
            q = rms(q, layer.q_a_layernorm.weight, eps)
        q = (q @ layer.q_b_proj.weight.T).view(length, heads, nope + rope)
        compressed = x[b] @ layer.kv_a_proj_with_mqa.weight.T
        latent = compressed[:, :rank]
        if norm == "lora":
            latent = rms(latent, layer.kv_a_layernorm.weight, eps)
        kv = (latent @ layer.kv_b_proj.weight.T).view(length, kv_heads, nope + vdim)
        for h in range(heads):
            g = h // (heads // kv_heads)
            q_h = q[:, h]
            k_h = torch.cat([kv[:, g, :nope], compressed[:, rank:]], dim=-1)
            if norm == "qk_head":
                q_h, k_h = rms(q_h, layer.q_norm.weight, eps), rms(k_h, layer.k_norm.weight, eps)
            q_h = torch.cat([q_h[:, :nope], rotate(q_h[:, nope:], positions[b], rope, theta, interleave)], dim=-1)
            k_h = torch.cat([k_h[:, :nope], rotate(k_h[:, nope:], positions[b], rope, theta, interleave)], dim=-1)
            v_h = kv[:, g, nope:]
            scores = (q_h @ k_h.T) / math.sqrt(nope + rope)
            scores = scores.masked_fill(~torch.ones(length, length, dtype=torch.bool).tril(), float("-inf"))
            out[b, :, h * vdim : (h + 1) * vdim] = torch.softmax(scores, dim=-1) @ v_h
    return out @ layer.out_proj.weight.T


def _layer(interleave=True, norm="qk_head", attn_implementation="eager"):
    config = tiny_config(rope_interleave=interleave, mla_norm=norm)
    config._attn_implementation = attn_implementation
    layer = ZebraMLA(config, layer_idx=1).double()
    with torch.no_grad():  # norm weights away from one, so a misplaced weight shows
        for name, p in layer.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return config, layer


@pytest.mark.parametrize(("interleave", "norm"), VARIANTS)
def test_mla_matches_explicit_attention(interleave, norm):
    for attn_implementation in ("eager", "sdpa") if (interleave, norm) == (True, "qk_head") else ("eager",):
        config, layer = _layer(interleave, norm, attn_implementation)
        rotary = ZebraRotaryEmbedding(config)
        x = torch.randn(2, 11, config.hidden_size, dtype=torch.float64)
        positions = torch.stack([torch.arange(11), torch.arange(5, 16)])
        mask = block_causal_mask(torch.ones(2, 11, dtype=torch.long))
        ours, _ = layer(x, position_embeddings=rotary(x, positions), attention_mask=mask)
        reference = naive_mla(layer, x, positions, config.rope_parameters["rope_theta"])
        # RoPE angles are computed in fp32 (as in transformers), the rest in fp64.
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("interleave", "norm"), VARIANTS)
def test_mla_gradients_match_explicit_attention(interleave, norm):
    config, layer = _layer(interleave, norm)
    rotary = ZebraRotaryEmbedding(config)
    x = torch.randn(1, 7, config.hidden_size, dtype=torch.float64, requires_grad=True)
    positions = torch.arange(7)[None]
    ours, _ = layer(x, position_embeddings=rotary(x, positions), attention_mask=block_causal_mask(torch.ones(1, 7)))
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

"""The MLA conventions of AMD's released checkpoints: interleaved RoPE pairs and the norm placements.

Interleaved RoPE is checked against transformers' own DeepSeek-V3 function and against the half-split
path after permuting the rope rows; every (rope_interleave, mla_norm) pair keeps packed == separate and
cached decode == full forward (SP is in ``sp_workers/mixers.py``).
"""

import pytest
import torch
from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave

from llamafactory_zebra.layers.mla import ZebraMLA, apply_rotary, interleaved_to_half_split
from llamafactory_zebra.modeling_zebra import ZebraHybridCache, ZebraRotaryEmbedding
from llamafactory_zebra.packing import block_causal_mask
from llamafactory_zebra.testing.models import tiny_config, tiny_model

NORMS = ("qk_head", "lora", "none")
VARIANTS = [(interleave, norm) for interleave in (True, False) for norm in NORMS]


def test_interleaved_rotary_equals_transformers_deepseek_v3():
    config = tiny_config(rope_parameters={"rope_type": "default", "rope_theta": 10_000.0})
    positions = torch.tensor([[0, 1, 2, 7, 300], [5, 6, 7, 8, 9]])
    q = torch.randn(2, 3, 5, config.qk_rope_head_dim, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 1, 5, config.qk_rope_head_dim, dtype=torch.float64, requires_grad=True)
    cos, sin = ZebraRotaryEmbedding(config).double()(q, positions)
    cos, sin = cos.double(), sin.double()
    ours = (apply_rotary(q, cos, sin, interleave=True), apply_rotary(k, cos, sin, interleave=True))
    theirs = apply_rotary_pos_emb_interleave(q, k, cos, sin)
    upstream = [torch.randn_like(t) for t in ours]
    for got, want in zip(ours, theirs, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    grads = torch.autograd.grad(sum((o * u).sum() for o, u in zip(ours, upstream, strict=True)), [q, k])
    expected = torch.autograd.grad(sum((t * u).sum() for t, u in zip(theirs, upstream, strict=True)), [q, k])
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    # Not the half-split rotation: the test can tell the two apart.
    assert (apply_rotary(q, cos, sin) - ours[0]).abs().max() > 1e-2


def _permute_rope_rows(interleaved: ZebraMLA, half: ZebraMLA) -> None:
    """Copy ``interleaved``'s weights into ``half`` with every rope row (and rope norm weight) permuted."""
    cfg = interleaved.config
    nope, rope, rank = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    order = torch.tensor(interleaved_to_half_split(rope))
    head_order = torch.cat([torch.arange(nope), nope + order])
    state = interleaved.state_dict()
    state["q_b_proj.weight"] = (
        state["q_b_proj.weight"]
        .view(cfg.num_attention_heads, nope + rope, -1)[:, head_order]
        .reshape_as(state["q_b_proj.weight"])
    )
    state["kv_a_proj_with_mqa.weight"] = state["kv_a_proj_with_mqa.weight"][
        torch.cat([torch.arange(rank), rank + order])
    ]
    for name in ("q_norm.weight", "k_norm.weight"):
        if name in state:
            state[name] = state[name][head_order]
    half.load_state_dict(state)


@pytest.mark.parametrize("norm", NORMS)
def test_interleaved_layer_equals_half_split_layer_with_permuted_rope_rows(norm):
    torch.manual_seed(0)
    layers = {}
    for interleave in (True, False):
        config = tiny_config(rope_interleave=interleave, mla_norm=norm)
        config._attn_implementation = "eager"
        layers[interleave] = ZebraMLA(config, layer_idx=1).double()
    with torch.no_grad():
        for name, p in layers[True].named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    _permute_rope_rows(layers[True], layers[False])
    x = torch.randn(2, 9, layers[True].config.hidden_size, dtype=torch.float64)
    positions = torch.stack([torch.arange(9), torch.arange(100, 109)])
    rotary = ZebraRotaryEmbedding(layers[True].config)
    embeddings = tuple(t.double() for t in rotary(x, positions))
    mask = block_causal_mask(torch.ones(2, 9, dtype=torch.long))
    outputs, input_grads = {}, {}
    for interleave, layer in layers.items():
        inputs = x.clone().requires_grad_()
        outputs[interleave], _ = layer(inputs, position_embeddings=embeddings, attention_mask=mask)
        outputs[interleave].square().sum().backward()
        input_grads[interleave] = inputs.grad
    torch.testing.assert_close(outputs[True], outputs[False], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(input_grads[True], input_grads[False], rtol=1e-12, atol=1e-12)
    # Parameter gradients agree after the same row permutation.
    permuted = ZebraMLA(layers[True].config, layer_idx=1).double()
    permuted.load_state_dict({name: p.grad for name, p in layers[True].named_parameters()})
    _permute_rope_rows(permuted, permuted)
    for name, p in layers[False].named_parameters():
        torch.testing.assert_close(p.grad, permuted.state_dict()[name], rtol=1e-12, atol=1e-12, msg=name)
    # Without the permutation the same weights give another layer.
    unpermuted = ZebraMLA(layers[False].config, layer_idx=1).double()
    unpermuted.load_state_dict(layers[True].state_dict())
    with torch.no_grad():
        other, _ = unpermuted(x, position_embeddings=embeddings, attention_mask=mask)
    assert (other - outputs[True]).abs().max() > 1e-4


@pytest.mark.parametrize(("interleave", "norm"), VARIANTS)
def test_packed_and_cached_runs_stay_exact_for_every_convention(interleave, norm):
    # Two MLA layers only: the conventions change nothing in GDN (covered by test_modeling.py at the default).
    model = tiny_model(rope_interleave=interleave, mla_norm=norm, num_hidden_layers=2, layer_types=["mla", "mla"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "mla" in name and "norm" in name:
                p.uniform_(0.5, 1.5)
    samples = [torch.randint(0, 97, (1, n)) for n in (5, 1, 8)]
    packed_ids = torch.cat(samples, dim=1)
    positions = torch.cat([torch.arange(s.shape[1]) for s in samples])[None]
    tokens = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        packed = model(packed_ids, position_ids=positions, use_cache=False).logits
        separate = torch.cat([model(s, use_cache=False).logits for s in samples], dim=1)
        full = model(tokens, use_cache=False).logits
        cache = ZebraHybridCache(model.config)
        steps = [model(tokens[:, :6], past_key_values=cache, use_cache=True).logits]
        steps += [model(tokens[:, t : t + 1], past_key_values=cache, use_cache=True).logits for t in range(6, 10)]
    torch.testing.assert_close(packed, separate, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-9, atol=1e-9)

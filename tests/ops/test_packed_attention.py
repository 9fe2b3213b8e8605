"""Packed rows on sdpa without a T x T mask (``ops/packed_attention.py``), against today's dense-mask path.

The reference everywhere is the dense block-causal mask (``packing.block_causal_mask``) with plain
attention, in fp64: the kernels, one MLA layer (forward and every gradient), and a tiny model (logits,
loss, gradients) with an explicit 4-D mask, which keeps the dense path. Odd shapes: a 1-token sample,
padding at the end of a row, neat_packing's 2-D segment ids, two rows. flex_attention runs forward
only on CPU (PyTorch 2.14 has no CPU backward for it), uncompiled.
"""

import warnings

import pytest
import torch

from llamafactory_zebra import kernels
from llamafactory_zebra.kernels import Key
from llamafactory_zebra.kernels.switches import PACKED_SDPA_ENV_VAR
from llamafactory_zebra.layers import mixer_inputs
from llamafactory_zebra.layers.mla import ZebraMLA
from llamafactory_zebra.modeling_zebra import ZebraRotaryEmbedding
from llamafactory_zebra.ops import packed_attention
from llamafactory_zebra.ops.packed_attention import (
    flex_packed_attention,
    packed_block_mask,
    per_segment_sdpa,
    token_segments,
)
from llamafactory_zebra.packing import (
    block_causal_mask,
    cu_seqlens_from_segment_ids,
    flash_varlen_kwargs,
    positions_within_segments,
)
from llamafactory_zebra.testing.models import tiny_config, tiny_model

# Two rows: a 1-token sample and padding at the end in the first, one sample filling the second.
SEGMENTS = torch.tensor([[1] * 9 + [2] + [3] * 13 + [0] * 3, [1] * 26])
# neat_packing's 2-D ids: the same numbers in both rows, padding at the end of each.
NEAT = torch.tensor([[1] * 5 + [2] * 11 + [3] * 1 + [0] * 3, [1] * 14 + [2] * 4 + [0] * 2])


def _dense_reference(query, key, value, segments, scale):
    """Plain attention with the dense block-causal mask: ``[B, T, heads, v]``."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = (query @ key.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~block_causal_mask(segments), float("-inf"))
    return (scores.softmax(-1) @ value).transpose(1, 2)


def _qkv(segments, heads=4, kv_heads=2, qk=24, v=8, requires_grad=False):
    batch, length = segments.shape
    generator = torch.Generator().manual_seed(0)
    shapes = ((batch, heads, length, qk), (batch, kv_heads, length, qk), (batch, kv_heads, length, v))
    return [
        torch.randn(*shape, dtype=torch.float64, generator=generator).requires_grad_(requires_grad) for shape in shapes
    ]


@pytest.mark.parametrize("segments", [SEGMENTS, NEAT], ids=["packing", "neat_packing"])
def test_per_segment_sdpa_equals_the_dense_mask_with_gradients(segments):
    query, key, value = _qkv(segments, requires_grad=True)
    upstream = torch.randn(*segments.shape, 4, 8, dtype=torch.float64)
    got = per_segment_sdpa(query, key, value, cu_seqlens_from_segment_ids(segments), 0.3)
    grads = torch.autograd.grad((got * upstream).sum(), (query, key, value))
    want = _dense_reference(query, key, value, segments, 0.3)
    want_grads = torch.autograd.grad((want * upstream).sum(), (query, key, value))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("qk, v", [(24, 8), (8, 24)], ids=["values-narrower", "values-wider"])
def test_per_segment_sdpa_with_two_head_sizes_keeps_no_square_for_backward(qk, v):
    """q/k and v of two head sizes (MLA's) still take sdpa's fused kernel, which saves nothing quadratic in a
    sample's length (the math kernel keeps its T x T weights), and equal the dense reference (fp32)."""
    segments = torch.tensor([[1] * 300 + [2] * 200])
    query, key, value = (x.float().detach().requires_grad_() for x in _qkv(segments, qk=qk, v=v))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        got = per_segment_sdpa(query, key, value, cu_seqlens_from_segment_ids(segments), 0.3)
    assert got.shape == (1, 500, 4, v)
    assert max(saved) < 200 * 200  # the shorter sample's square; q, k, v and the output are 500 x 4 x 24
    upstream = torch.randn(*got.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((got * upstream).sum(), (query, key, value))
    reference = [x.detach().double().requires_grad_() for x in (query, key, value)]
    want = _dense_reference(*reference, segments, 0.3)
    want_grads = torch.autograd.grad((want * upstream.double()).sum(), reference)
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, w.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block_size", [4, 16, 128])
@pytest.mark.parametrize("segments", [SEGMENTS, NEAT], ids=["packing", "neat_packing"])
def test_block_mask_from_borders_equals_flex_attention_own(segments, block_size):
    """The tiles (partial and full) equal what ``create_block_mask`` finds by evaluating every token pair."""
    from torch.nn.attention.flex_attention import create_block_mask

    cu_seqlens = cu_seqlens_from_segment_ids(segments)
    tokens = segments.numel()
    index = token_segments(cu_seqlens)

    def within_segment(batch, head, query_index, key_index):
        return (index[query_index] == index[key_index]) & (query_index >= key_index)

    upstream = create_block_mask(within_segment, 1, 1, tokens, tokens, device="cpu", BLOCK_SIZE=block_size)
    ours = packed_block_mask(cu_seqlens, block_size)
    assert torch.equal(ours.to_dense(), upstream.to_dense())
    assert torch.equal(ours.full_kv_num_blocks, upstream.full_kv_num_blocks)
    assert torch.equal(ours.kv_num_blocks, upstream.kv_num_blocks)


@pytest.mark.parametrize("segments", [SEGMENTS, NEAT], ids=["packing", "neat_packing"])
def test_flex_attention_forward_equals_the_dense_mask(segments):
    query, key, value = _qkv(segments)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex's "running uncompiled" notice
        got = flex_packed_attention(query, key, value, cu_seqlens_from_segment_ids(segments), 0.3, False, 8)
    torch.testing.assert_close(got, _dense_reference(query, key, value, segments, 0.3), rtol=1e-12, atol=1e-12)


def test_the_policy_picks_the_kernel_by_device_and_lets_the_user_force_one(monkeypatch):
    assert kernels.packed_attention("sdpa", "cpu").key == Key.SDPA_PER_SEGMENT
    assert kernels.packed_attention("sdpa", "cuda").key == Key.FLEX_BLOCK_MASK
    assert kernels.packed_attention("eager", "cuda").key == Key.DENSE_MASK
    monkeypatch.setenv(PACKED_SDPA_ENV_VAR, "dense_mask")
    assert kernels.packed_attention("sdpa", "cuda").key == Key.DENSE_MASK
    assert kernels.packed_attention("flash_attention_2", "cuda").key == Key.FLASH_VARLEN
    monkeypatch.setenv(PACKED_SDPA_ENV_VAR, "blocky")
    with pytest.raises(ValueError, match="ZEBRA_PACKED_SDPA='blocky' is not valid; use one of auto, flex"):
        kernels.packed_attention("sdpa", "cpu")


def _mla_outputs(layer, hidden, cos, sin, upstream, **inputs):
    hidden = hidden.clone().requires_grad_()
    output, _ = layer(hidden, position_embeddings=(cos, sin), **inputs)
    (output * upstream).sum().backward()
    grads = {"hidden": hidden.grad, **{name: p.grad.clone() for name, p in layer.named_parameters()}}
    layer.zero_grad()
    return output.detach(), grads


@pytest.mark.parametrize("mla_norm", ["qk_head", "lora"])
def test_mla_layer_on_borders_equals_the_dense_mask_forward_and_backward(mla_norm):
    """Zebra's 16 query / 8 key-value heads (GQA), fp64: output and every gradient."""
    config = tiny_config(num_attention_heads=16, num_key_value_heads=8, mla_norm=mla_norm)
    config._attn_implementation = "sdpa"
    layer = ZebraMLA(config, layer_idx=0).double()
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(*SEGMENTS.shape, config.hidden_size, dtype=torch.float64, generator=generator)
    upstream = torch.randn(hidden.shape, dtype=torch.float64, generator=generator)
    cos, sin = ZebraRotaryEmbedding(config)(hidden, positions_within_segments(SEGMENTS))
    got, got_grads = _mla_outputs(layer, hidden, cos, sin, upstream, **flash_varlen_kwargs(SEGMENTS))
    want, want_grads = _mla_outputs(layer, hidden, cos, sin, upstream, attention_mask=block_causal_mask(SEGMENTS))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert got_grads.keys() == want_grads.keys()
    for name in got_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], rtol=1e-10, atol=1e-12, msg=name)


def _model_run(model, input_ids, labels, **inputs):
    model.zero_grad()
    output = model(input_ids, labels=labels, use_cache=False, **inputs)
    output.loss.backward()
    return output.logits.detach(), output.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _no_dense_mask(*args, **kwargs):
    raise AssertionError("the dense block-causal mask was built for packed sdpa rows")


@pytest.mark.parametrize("signal", ["position_ids", "neat_packing"])
def test_tiny_model_on_borders_equals_the_dense_mask_and_builds_no_mask(monkeypatch, signal):
    """sdpa model, two packed rows: logits, loss and every gradient equal the same model handed the dense
    4-D block mask (today's path, kept for explicit masks); the new path never builds that mask."""
    model = tiny_model(attn_implementation="sdpa").train()
    segments = SEGMENTS if signal == "position_ids" else NEAT
    input_ids = torch.randint(1, 97, segments.shape, generator=torch.Generator().manual_seed(2))
    labels = input_ids.masked_fill(segments == 0, -100)
    positions = positions_within_segments(segments)
    inputs = {"position_ids": positions} if signal == "position_ids" else {"attention_mask": segments}
    if signal == "position_ids":
        labels[0, -3:] = -100
    # neat_packing without position_ids: positions run on across samples, in both runs.
    dense = {
        "attention_mask": block_causal_mask(segments),
        **({"position_ids": positions} if signal == "position_ids" else {}),
    }
    want_logits, want_loss, want_grads = _model_run(model, input_ids, labels, **dense)

    calls = []
    original = packed_attention.per_segment_sdpa
    monkeypatch.setattr(mixer_inputs, "block_causal_mask", _no_dense_mask)
    monkeypatch.setattr(
        "llamafactory_zebra.layers.mla.per_segment_sdpa", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    got_logits, got_loss, got_grads = _model_run(model, input_ids, labels, **inputs)
    assert len(calls) == sum(t == "mla" for t in model.config.layer_types)
    real = segments != 0
    torch.testing.assert_close(got_logits[real], want_logits[real], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-10, atol=1e-12)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-8, atol=1e-10, msg=name)


def test_perturbing_one_sample_moves_no_other_sample_on_the_border_path():
    model = tiny_model(attn_implementation="sdpa")
    input_ids = torch.randint(1, 97, NEAT.shape, generator=torch.Generator().manual_seed(3))
    perturbed = input_ids.clone()
    target = (torch.arange(NEAT.shape[1]) >= 5) & (torch.arange(NEAT.shape[1]) < 16)  # row 0, sample 2
    perturbed[0, target] = (perturbed[0, target] + 11) % 97
    with torch.no_grad():
        before = model(input_ids, attention_mask=NEAT, use_cache=False).logits
        after = model(perturbed, attention_mask=NEAT, use_cache=False).logits
    moved = (before - after).abs().amax(-1) > 0
    assert moved[0, target].all()
    others = torch.ones_like(moved)
    others[0, target] = False
    others &= NEAT != 0
    assert not moved[others].any(), moved.nonzero().tolist()


def test_flex_attention_refuses_dropout_with_a_clear_message(monkeypatch):
    config = tiny_config(attention_dropout=0.1)
    config._attn_implementation = "sdpa"
    layer = ZebraMLA(config, layer_idx=0).double().train()
    monkeypatch.setenv(PACKED_SDPA_ENV_VAR, "flex")
    hidden = torch.randn(*SEGMENTS.shape, config.hidden_size, dtype=torch.float64)
    cos, sin = ZebraRotaryEmbedding(config)(hidden, positions_within_segments(SEGMENTS))
    with pytest.raises(ValueError, match="attention_dropout=0.1 on packed rows: flex_attention has no dropout"):
        layer(hidden, position_embeddings=(cos, sin), **flash_varlen_kwargs(SEGMENTS))


def test_sdpa_forward_without_packing_matches_eager():
    """One sample per row goes through transformers' sdpa as before: same logits as eager."""
    sdpa, eager = tiny_model(attn_implementation="sdpa"), tiny_model(attn_implementation="eager")
    eager.load_state_dict(sdpa.state_dict())
    input_ids = torch.randint(1, 97, (2, 11), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(sdpa(input_ids).logits, eager(input_ids).logits, rtol=1e-9, atol=1e-9)


def test_the_worked_examples_hold():
    import doctest

    results = doctest.testmod(packed_attention)
    assert results.attempted >= 1 and results.failed == 0

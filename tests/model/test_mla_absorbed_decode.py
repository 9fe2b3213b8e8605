"""Absorbed MLA decode (kv_b_proj folded into queries and output) against the expanding path and a
one-shot forward, for every MLA norm placement and RoPE pairing, with left-padded batches."""

from __future__ import annotations

import functools

import pytest
import torch

from llamafactory_zebra import ZebraConfig, ZebraForCausalLM
from llamafactory_zebra.layers import mla_decode
from llamafactory_zebra.layers.mla import CACHE_PATH_KEYWORD, EXPAND, LATENT
from llamafactory_zebra.modeling_zebra import ZebraHybridCache

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def perturbed_tiny(attn: str, mla_norm: str, rope_interleave: bool) -> ZebraForCausalLM:
    """The tiny model with every weight moved off its initial value (norm weights are not all ones)."""
    torch.manual_seed(0)
    config = ZebraConfig.from_preset(
        "tiny", attn_implementation=attn, mla_norm=mla_norm, rope_interleave=rope_interleave
    )
    model = ZebraForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model


def decode_logits(model, prompt, mask, steps, cache_path=LATENT):
    """Prefill, then one token at a time, then three tokens in one step: logits of every new position."""
    cache = ZebraHybridCache(model.config)
    outputs = []
    path = {CACHE_PATH_KEYWORD: cache_path}
    with torch.no_grad():
        model(prompt, attention_mask=mask, past_key_values=cache, **path)
        for t in range(steps.shape[1]):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            outputs.append(model(steps[:, t : t + 1], attention_mask=mask, past_key_values=cache, **path).logits)
        mask = torch.cat([mask, torch.ones_like(mask[:, :3])], dim=1)
        outputs.append(model(steps[:, :3], attention_mask=mask, past_key_values=cache, **path).logits)
    return torch.cat(outputs, dim=1)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("rope_interleave", [False, True])
@pytest.mark.parametrize("mla_norm", ["none", "qk_head", "lora"])
def test_absorbed_decode_matches_the_expanding_path_and_a_one_shot_forward(
    mla_norm, rope_interleave, attn, monkeypatch
):
    model = perturbed_tiny(attn, mla_norm, rope_interleave)
    prompt = torch.randint(3, 1000, (3, 19))
    mask = torch.ones_like(prompt)
    mask[1, :6] = 0
    mask[2, :1] = 0
    steps = torch.randint(3, 1000, (3, 5))

    expanded = decode_logits(model, prompt, mask, steps, cache_path=EXPAND)
    calls = []
    original = mla_decode.absorbed_attention
    monkeypatch.setattr(mla_decode, "absorbed_attention", lambda *a, **k: calls.append(1) or original(*a, **k))
    absorbed = decode_logits(model, prompt, mask, steps)
    assert len(calls) == 6 * len(model.config.mla_layers)  # five 1-token steps and one 3-token step

    sequence = torch.cat([prompt, steps, steps[:, :3]], dim=1)
    full_mask = torch.cat([mask, torch.ones(3, 8, dtype=mask.dtype)], dim=1)
    with torch.no_grad():
        reference = model(sequence, attention_mask=full_mask).logits[:, prompt.shape[1] :]
    torch.testing.assert_close(absorbed, expanded, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(absorbed, reference, atol=1e-5, rtol=1e-5)


def test_batched_left_padded_generation_equals_each_row_alone():
    model = perturbed_tiny("sdpa", "qk_head", True)
    rows = [torch.randint(3, 1000, (n,)) for n in (9, 16, 4)]
    width = max(len(r) for r in rows)
    batch = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(batch)
    for i, row in enumerate(rows):
        batch[i, width - len(row) :] = row
        mask[i, width - len(row) :] = 1
    together = model.generate(batch, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    for i, row in enumerate(rows):
        alone = model.generate(row[None], max_new_tokens=8, do_sample=False, pad_token_id=0)
        assert torch.equal(together[i, width:], alone[0, len(row) :])


def test_qk_head_cache_holds_one_scale_per_key_head_next_to_the_latent():
    model = perturbed_tiny("eager", "qk_head", False)
    cache = ZebraHybridCache(model.config)
    with torch.no_grad():
        model(torch.randint(3, 1000, (2, 7)), past_key_values=cache)
    layer = cache.layers[model.config.mla_layers[0]]
    config = model.config
    assert layer.keys.shape[-1] == config.kv_lora_rank
    assert layer.values.shape[-1] == config.qk_rope_head_dim + config.num_key_value_heads


@pytest.mark.parametrize("mla_norm", ["qk_head", "lora"])
def test_a_lora_adapter_on_kv_b_proj_reaches_the_key_scale_and_the_absorbed_decode(mla_norm):
    """PEFT adds its delta in ``kv_b_proj.forward`` only: the cached key scale and the absorbed matrices must
    see it, so the adapter model equals its merged copy in a one-shot forward and in cached decoding."""
    from peft import LoraConfig, get_peft_model

    model = perturbed_tiny("sdpa", mla_norm, True)
    adapter_config = LoraConfig(r=4, target_modules=["kv_b_proj", "q_b_proj"], init_lora_weights=False)
    with_adapter = get_peft_model(model, adapter_config).eval()
    prompt = torch.randint(3, 1000, (2, 13))
    mask = torch.ones_like(prompt)
    mask[1, :4] = 0
    steps = torch.randint(3, 1000, (2, 4))
    sequence, full_mask = torch.cat([prompt, steps], dim=1), torch.ones(2, 17, dtype=mask.dtype)
    full_mask[1, :4] = 0
    with torch.no_grad():
        adapter_forward = with_adapter(sequence, attention_mask=full_mask).logits
    adapter_decode = decode_logits(with_adapter, prompt, mask, steps)
    merged = with_adapter.merge_and_unload()
    with torch.no_grad():
        merged_forward = merged(sequence, attention_mask=full_mask).logits
    torch.testing.assert_close(adapter_forward, merged_forward, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(adapter_decode, decode_logits(merged, prompt, mask, steps), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("score_elements", [None, 200], ids=["one-query-block", "query-blocks"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("mla_norm", ["none", "qk_head", "lora"])
def test_prefill_chunks_longer_than_a_decode_step_match_the_one_shot_forward(
    mla_norm, attn, score_elements, monkeypatch
):
    """Chunks of more than ``ABSORBED_DECODE_MAX_QUERIES`` tokens against a cache expand the latents one key
    head at a time (and, with a small score budget, go in blocks of 3-8 queries); with left padding and
    chunk sizes that do not divide the prompt, every real position's logits equal the one-shot forward's
    and the stock (all heads at once) path's."""
    from llamafactory_zebra.evaluation.prefill import chunked_prefill
    from llamafactory_zebra.layers.mla_decode import ABSORBED_DECODE_MAX_QUERIES

    if score_elements is not None:
        monkeypatch.setattr(mla_decode, "CACHED_CHUNK_SCORE_ELEMENTS", score_elements)
    model = perturbed_tiny(attn, mla_norm, True)
    ids = torch.randint(3, 1000, (3, 61))
    mask = torch.ones_like(ids)
    mask[1, :25] = 0  # the first chunk of this row is padding only
    mask[2, :2] = 0
    with torch.no_grad():
        reference = model(ids, attention_mask=mask).logits
    calls = []
    original = mla_decode.attention_by_key_head
    monkeypatch.setattr(mla_decode, "attention_by_key_head", lambda *a, **k: calls.append(1) or original(*a, **k))
    for chunk in (ABSORBED_DECODE_MAX_QUERIES + 1, 24):
        results = {}
        for absorbed, path in ((True, LATENT), (False, EXPAND)):
            pieces: list[torch.Tensor] = []
            on_path = functools.partial(model, **{CACHE_PATH_KEYWORD: path})
            chunked_prefill(on_path, ids, mask, chunk, on_chunk=lambda start, logits, out=pieces: out.append(logits))
            results[absorbed] = torch.cat(pieces, dim=1)
        for row in range(3):
            real = mask[row] == 1
            torch.testing.assert_close(results[True][row, real], reference[row, real], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(results[True][row, real], results[False][row, real], atol=1e-5, rtol=1e-5)
    # After the first chunk: 17, 17 (then 10: a decode-sized step) and 24 (then 13).
    assert len(calls) == 3 * len(model.config.mla_layers)


def test_an_unknown_cache_path_is_refused_naming_the_keyword():
    model = perturbed_tiny("eager", "qk_head", True)
    with pytest.raises(ValueError, match="mla_cache_path='absorbed': use one of latent, expand"):
        model(torch.randint(3, 1000, (1, 4)), **{CACHE_PATH_KEYWORD: "absorbed"})

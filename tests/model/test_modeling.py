"""Model-level behaviour: packing isolation, decode cache, save/load, released layout, gradients."""

import json

import pytest
import torch

from llamafactory_zebra import ZebraForCausalLM
from llamafactory_zebra.modeling_zebra import ZebraHybridCache
from llamafactory_zebra.released import load_released_config
from llamafactory_zebra.testing.models import tiny_config, tiny_model, write_released_layout

LENGTHS = (5, 1, 12, 3, 9)  # a 1-token sample and samples shorter than the conv width


def _samples(vocab=97, lengths=LENGTHS):
    return [torch.randint(0, vocab, (1, n)) for n in lengths]


def _separate_logits(model, samples):
    with torch.no_grad():
        return [model(s, use_cache=False).logits for s in samples]


def _packed(samples):
    input_ids = torch.cat(samples, dim=1)
    position_ids = torch.cat([torch.arange(s.shape[1]) for s in samples])[None]
    segments = torch.cat([torch.full((s.shape[1],), i + 1) for i, s in enumerate(samples)])[None]
    return input_ids, position_ids, segments


def _split(logits, samples):
    return logits.split([s.shape[1] for s in samples], dim=1)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("signal", ["position_ids", "segment_mask", "segment_mask_and_positions", "4d_mask"])
def test_packed_logits_equal_separate_runs(signal, attn_implementation):
    model = tiny_model(attn_implementation=attn_implementation)
    samples = _samples()
    input_ids, position_ids, segments = _packed(samples)
    kwargs = {
        "position_ids": {"position_ids": position_ids},
        "segment_mask": {"attention_mask": segments},
        "segment_mask_and_positions": {"attention_mask": segments, "position_ids": position_ids},
        "4d_mask": {"attention_mask": _block_diagonal_additive(segments), "position_ids": position_ids},
    }[signal]
    with torch.no_grad():
        packed = model(input_ids, use_cache=False, **kwargs).logits
    if signal == "segment_mask":
        # Without restarting position_ids the positions run on across samples: compare against the
        # samples at those same positions, which must still not see each other.
        offsets = torch.cumsum(torch.tensor([0, *[s.shape[1] for s in samples[:-1]]]), 0)
        expected = []
        with torch.no_grad():
            for s, offset in zip(samples, offsets, strict=True):
                positions = torch.arange(offset, offset + s.shape[1])[None]
                expected.append(model(s, position_ids=positions, use_cache=False).logits)
    else:
        expected = _separate_logits(model, samples)
    for got, want in zip(_split(packed, samples), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def _block_diagonal_additive(segments):
    length = segments.shape[1]
    allowed = (segments[:, :, None] == segments[:, None, :]) & torch.ones(length, length, dtype=torch.bool).tril()
    mask = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
    return mask[:, None]


def test_perturbing_one_packed_sample_leaves_the_others_unchanged():
    model = tiny_model()
    samples = _samples()
    input_ids, position_ids, _ = _packed(samples)
    perturbed = input_ids.clone()
    start = samples[0].shape[1] + samples[1].shape[1]
    perturbed[0, start : start + samples[2].shape[1]] = (perturbed[0, start : start + samples[2].shape[1]] + 7) % 97
    with torch.no_grad():
        before = _split(model(input_ids, position_ids=position_ids, use_cache=False).logits, samples)
        after = _split(model(perturbed, position_ids=position_ids, use_cache=False).logits, samples)
    for index, (a, b) in enumerate(zip(before, after, strict=True)):
        if index == 2:
            assert not torch.allclose(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_packed_rows_in_a_batch_are_isolated_from_each_other_and_padding():
    model = tiny_model()
    row_a, row_b = _samples(lengths=(4, 6)), _samples(lengths=(7,))
    ids_a, pos_a, seg_a = _packed(row_a)
    ids_b, pos_b, seg_b = _packed(row_b)
    pad = torch.zeros(1, 3, dtype=torch.long)
    input_ids = torch.cat([ids_a, torch.cat([ids_b, pad], dim=1)])
    segments = torch.cat([seg_a, torch.cat([seg_b, pad], dim=1)])
    with torch.no_grad():
        logits = model(
            input_ids, attention_mask=segments, position_ids=torch.cat([pos_a, torch.cat([pos_b, pad], 1)])
        ).logits
    expected = _separate_logits(model, row_a + row_b)
    torch.testing.assert_close(logits[0, :4], expected[0][0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(logits[0, 4:], expected[1][0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(logits[1, :7], expected[2][0], rtol=1e-9, atol=1e-9)


def test_cached_greedy_decode_equals_uncached():
    model = tiny_model()
    prompt = torch.randint(0, 97, (1, 9))
    cached = model.generate(prompt, max_new_tokens=12, do_sample=False, use_cache=True)
    uncached = model.generate(prompt, max_new_tokens=12, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)


def test_incremental_logits_equal_full_forward():
    model = tiny_model()
    tokens = torch.randint(0, 97, (2, 14))
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
        cache = ZebraHybridCache(model.config)
        prefix = model(tokens[:, :6], past_key_values=cache, use_cache=True).logits
        continuation = model(tokens[:, 6:10], past_key_values=cache, use_cache=True).logits  # several at once
        steps = [model(tokens[:, t : t + 1], past_key_values=cache, use_cache=True).logits for t in range(10, 14)]
    torch.testing.assert_close(torch.cat([prefix, continuation, *steps], dim=1), full, rtol=1e-9, atol=1e-9)


def test_left_padded_batch_generation_equals_single_prompts():
    model = tiny_model()
    short, long = torch.randint(1, 97, (1, 4)), torch.randint(1, 97, (1, 8))
    batch = torch.cat([torch.cat([torch.zeros(1, 4, dtype=torch.long), short], 1), long])
    mask = torch.cat([torch.cat([torch.zeros(1, 4), torch.ones(1, 4)], 1), torch.ones(1, 8)]).long()
    together = model.generate(batch, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    alone = model.generate(short, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(together[0, 4:], alone[0])


def test_mla_cache_holds_the_latent_not_expanded_kv():
    model = tiny_model(dtype=torch.float32)
    cache = ZebraHybridCache(model.config)
    with torch.no_grad():
        model(torch.randint(0, 97, (1, 10)), past_key_values=cache, use_cache=True)
    cfg = model.config
    per_token = len(cfg.mla_layers) * cfg.mla_cache_channels * 4
    assert cfg.mla_cache_channels == cfg.kv_lora_rank + cfg.qk_rope_head_dim + cfg.num_key_value_heads  # qk_head
    assert cache.bytes_per_token() == per_token
    expanded = len(cfg.mla_layers) * cfg.num_key_value_heads * (cfg.qk_head_dim + cfg.v_head_dim) * 4
    assert per_token < expanded


def test_every_parameter_gets_a_gradient():
    model = tiny_model(dtype=torch.float32).train()
    tokens = torch.randint(0, 97, (2, 17))
    model(tokens, labels=tokens).loss.backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_gradient_checkpointing_gives_the_same_gradients():
    tokens = torch.randint(0, 97, (2, 21))
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = tiny_model(dtype=torch.float64).train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model(tokens, labels=tokens).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-10, atol=1e-12)


def test_bf16_forward_tracks_fp32():
    model = tiny_model(dtype=torch.float32)
    tokens = torch.randint(0, 97, (1, 33))
    with torch.no_grad():
        reference = model(tokens).logits
        low = model.to(torch.bfloat16)(tokens).logits.float()
    assert (low - reference).abs().max() < 0.1 * reference.abs().max()


def test_save_load_round_trip(tmp_path):
    model = tiny_model(dtype=torch.float32)
    model.save_pretrained(tmp_path)
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
    assert type(loaded) is ZebraForCausalLM
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    tokens = torch.randint(0, 97, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens).logits, model(tokens).logits, rtol=0, atol=0)


RELEASED_ROPE = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 32.0, "original_max_position_embeddings": 32768}


def test_released_layout_directory_loads(tmp_path):
    source = tiny_model(dtype=torch.float32, rope_parameters=dict(RELEASED_ROPE))
    write_released_layout(tmp_path / "released", source)
    config = load_released_config(tmp_path / "released")
    assert config.layer_types == source.config.layer_types
    assert config.rope_parameters["rope_type"] == "yarn" and config.rope_parameters["factor"] == 32.0
    assert config.max_position_embeddings == 32768 * 32
    loaded = ZebraForCausalLM.from_pretrained(
        tmp_path / "released", dtype=torch.float32, attn_implementation="eager"
    ).eval()
    from transformers import AutoModelForCausalLM

    auto = AutoModelForCausalLM.from_pretrained(
        tmp_path / "released", config=config, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tokens = torch.randint(0, 97, (1, 10))
    with torch.no_grad():
        expected = source(tokens).logits
        torch.testing.assert_close(loaded(tokens).logits, expected, rtol=0, atol=0)
        torch.testing.assert_close(auto(tokens).logits, expected, rtol=0, atol=0)


def test_import_command_writes_a_native_checkpoint(tmp_path):
    from llamafactory_zebra.cli.main import main

    source = tiny_model(dtype=torch.float32, rope_parameters=dict(RELEASED_ROPE))
    write_released_layout(tmp_path / "released", source)
    assert main(["import", str(tmp_path / "released"), str(tmp_path / "native")]) == 0
    assert json.loads((tmp_path / "native" / "config.json").read_text())["model_type"] == "zebra"
    from transformers import AutoModelForCausalLM

    native = AutoModelForCausalLM.from_pretrained(
        tmp_path / "native", dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tokens = torch.randint(0, 97, (1, 10))
    with torch.no_grad():
        torch.testing.assert_close(native(tokens).logits, source(tokens).logits, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("drop", "extra", "message"),
    [("model.layers.0.gdn.A_log", None, "missing"), (None, "model.layers.0.gdn.extra", "unexpected")],
)
def test_released_layout_with_wrong_keys_is_rejected(tmp_path, drop, extra, message):
    write_released_layout(tmp_path / "released", tiny_model(dtype=torch.float32), drop=drop, extra=extra)
    with pytest.raises(ValueError, match=message):
        ZebraForCausalLM.from_pretrained(tmp_path / "released")
    from llamafactory_zebra.cli.main import main

    assert main(["import", str(tmp_path / "released"), str(tmp_path / "native")]) == 2


def test_released_layout_with_bad_plan_names_the_field(tmp_path):
    write_released_layout(tmp_path / "released", tiny_model(dtype=torch.float32))
    hybrid = json.loads((tmp_path / "released" / "hybrid_config.json").read_text())
    hybrid["mla_layers"] = [1, 40]
    (tmp_path / "released" / "hybrid_config.json").write_text(json.dumps(hybrid))
    with pytest.raises(ValueError, match="mla_layers"):
        load_released_config(tmp_path / "released")


def test_fused_cross_entropy_matches_the_plain_loss():
    """The chunked fused loss against cross-entropy over full fp64 logits (transformers' own loss upcasts to fp32)."""
    tokens = torch.randint(0, 97, (2, 19))
    labels = tokens.clone()
    labels[0, :5] = -100
    results = []
    for fused in (False, True):
        torch.manual_seed(0)
        model = tiny_model(dtype=torch.float64).train()
        if fused:
            assert model.enable_fused_cross_entropy("auto") == "chunked"
            out = model(tokens, labels=labels)
            assert out.logits is None
            loss = out.loss
        else:
            logits = model(tokens).logits
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-12, atol=1e-12)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, rtol=1e-9, atol=1e-12)


def test_fused_cross_entropy_honours_num_items_in_batch():
    model = tiny_model(dtype=torch.float64).train()
    model.enable_fused_cross_entropy("chunked")
    tokens = torch.randint(0, 97, (1, 12))
    mean = model(tokens, labels=tokens).loss
    summed = model(tokens, labels=tokens, num_items_in_batch=torch.tensor(1)).loss
    torch.testing.assert_close(summed, mean * 11)


def test_wrong_cache_type_is_rejected():
    from transformers import DynamicCache

    model = tiny_model()
    with pytest.raises(TypeError, match="ZebraHybridCache"):
        model(torch.randint(0, 97, (1, 4)), past_key_values=DynamicCache())


def test_model_builds_for_a_config_without_mla_layers():
    model = ZebraForCausalLM(tiny_config(layer_types=["gdn"] * 4)).double().eval()
    prompt = torch.randint(0, 97, (1, 5))
    assert torch.equal(
        model.generate(prompt, max_new_tokens=5, do_sample=False),
        model.generate(prompt, max_new_tokens=5, do_sample=False, use_cache=False),
    )


def test_value_head_checkpoint_reloads_with_the_wrapper_keys_reported(tmp_path):
    """trl's value-head wrapper saves ``v_head.summary.*`` into the model's own file (the format of its PPO and
    value-head tools); transformers reports such keys as unexpected and loads, and so does the Zebra. The
    Zebra's own weights still load exactly, and the wrapper reloads its head from the same file."""
    from trl import AutoModelForCausalLMWithValueHead

    source = tiny_model(dtype=torch.float32)
    wrapped = AutoModelForCausalLMWithValueHead.from_pretrained(source)
    wrapped.save_pretrained(tmp_path / "value-head")
    model, info = ZebraForCausalLM.from_pretrained(
        tmp_path / "value-head", dtype=torch.float32, output_loading_info=True
    )
    assert sorted(info["unexpected_keys"]) == ["v_head.summary.bias", "v_head.summary.weight"]
    assert not info["missing_keys"]
    for name, tensor in source.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0, msg=name)
    reloaded = AutoModelForCausalLMWithValueHead.from_pretrained(str(tmp_path / "value-head"), dtype=torch.float32)
    torch.testing.assert_close(reloaded.v_head.summary.weight, wrapped.v_head.summary.weight, rtol=0, atol=0)


def test_an_extra_layer_key_under_the_zebra_is_still_refused(tmp_path):
    """A key under ``model.`` that the layer plan lacks is the Zebra's own mismatch, not a wrapper's: refused."""
    from safetensors.torch import load_file, save_file

    tiny_model(dtype=torch.float32).save_pretrained(tmp_path / "m")
    weights = load_file(tmp_path / "m" / "model.safetensors")
    weights["model.layers.9.mlp.up_proj.weight"] = torch.zeros(2, 2)
    save_file(weights, tmp_path / "m" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"unexpected_keys \(1\): model.layers.9.mlp.up_proj.weight"):
        ZebraForCausalLM.from_pretrained(tmp_path / "m")

"""``output_hidden_states``: transformers' convention (embeddings + every layer's output, the last one after
the final norm) in every forward path, and the value heads that read ``hidden_states[-1]`` (reward models,
PPO) on a Zebra — full and with a LoRA adapter.

References are independent of the recording mechanism: forward hooks on the decoder layers, the model's
own final norm, and each packed sample (or padded row) run alone.
"""

import pytest
import torch
from sp_workers.harness import launch, packed_segments, positions_from_segments, worst

from llamafactory_zebra.modeling_zebra import ZebraHybridCache
from llamafactory_zebra.testing.models import tiny_model

TOLERANCE = {"rtol": 1e-9, "atol": 1e-9}  # fp64 tiny model


def _layer_outputs_by_hooks(model, *args, **kwargs):
    """Each decoder layer's input and output as plain forward hooks see them, and the model's outputs."""
    seen = []
    handles = [
        layer.register_forward_hook(lambda module, args, output: seen.append((args[0], output)))
        for layer in model.model.layers
    ]
    try:
        with torch.no_grad():
            out = model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return seen, out


def test_hidden_states_are_embeddings_layer_outputs_and_final_norm():
    model = tiny_model()
    tokens = torch.randint(0, 97, (2, 11))
    seen, out = _layer_outputs_by_hooks(model, tokens, use_cache=False, output_hidden_states=True)
    states = out.hidden_states
    layers = model.config.num_hidden_layers
    assert isinstance(states, tuple) and len(states) == layers + 1
    assert all(s.shape == (2, 11, model.config.hidden_size) for s in states)
    torch.testing.assert_close(states[0], model.model.embed_tokens(tokens), **TOLERANCE)
    for i in range(1, layers):
        torch.testing.assert_close(states[i], seen[i - 1][1], **TOLERANCE)
        torch.testing.assert_close(states[i], seen[i][0], **TOLERANCE)
    with torch.no_grad():
        torch.testing.assert_close(states[-1], model.model.norm(seen[-1][1]), **TOLERANCE)
        torch.testing.assert_close(model.lm_head(states[-1]), out.logits, **TOLERANCE)


def test_hidden_states_follow_the_config_flag_and_return_dict():
    model = tiny_model()
    tokens = torch.randint(0, 97, (1, 6))
    with torch.no_grad():
        assert model(tokens, use_cache=False).hidden_states is None
        model.config.output_hidden_states = True
        by_config = model(tokens, use_cache=False).hidden_states
        model.config.output_hidden_states = False
        as_tuple = model(tokens, use_cache=False, output_hidden_states=True, return_dict=False)
        base = model.model(tokens, use_cache=False, output_hidden_states=True)
    assert len(by_config) == model.config.num_hidden_layers + 1
    assert isinstance(as_tuple, tuple)
    logits, states = as_tuple  # to_tuple() drops the None loss and cache
    for a, b, c in zip(by_config, states, base.hidden_states, strict=True):
        torch.testing.assert_close(a, b, **TOLERANCE)
        torch.testing.assert_close(a, c, **TOLERANCE)
    torch.testing.assert_close(base.last_hidden_state, by_config[-1], **TOLERANCE)


@pytest.mark.parametrize("signal", ["position_ids", "segment_mask"])
def test_packed_rows_hidden_states_equal_each_sample_alone(signal):
    model = tiny_model(attn_implementation="sdpa")
    lengths = (5, 1, 9, 3)
    samples = [torch.randint(0, 97, (1, n)) for n in lengths]
    input_ids = torch.cat(samples, 1)
    kwargs = (
        {"position_ids": torch.cat([torch.arange(n) for n in lengths])[None]}
        if signal == "position_ids"
        else {
            "attention_mask": torch.cat([torch.full((n,), i + 1) for i, n in enumerate(lengths)])[None],
            "position_ids": torch.cat([torch.arange(n) for n in lengths])[None],
        }
    )
    with torch.no_grad():
        packed = model(input_ids, use_cache=False, output_hidden_states=True, **kwargs).hidden_states
        alone = [model(s, use_cache=False, output_hidden_states=True).hidden_states for s in samples]
    for layer, states in enumerate(packed):
        for got, sample in zip(states.split(lengths, dim=1), alone, strict=True):
            torch.testing.assert_close(got, sample[layer], **TOLERANCE, msg=f"layer {layer}")


def test_cached_decode_hidden_states_are_those_of_the_new_tokens():
    model = tiny_model()
    tokens = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        full = model(tokens, use_cache=False, output_hidden_states=True).hidden_states
        cache = ZebraHybridCache(model.config)
        prefill = model(tokens[:, :7], past_key_values=cache, use_cache=True, output_hidden_states=True)
        steps = [
            model(tokens[:, t : t + 1], past_key_values=cache, use_cache=True, output_hidden_states=True)
            for t in range(7, 10)
        ]
    for layer, want in enumerate(full):
        got = torch.cat([prefill.hidden_states[layer], *(s.hidden_states[layer] for s in steps)], dim=1)
        torch.testing.assert_close(got, want, **TOLERANCE, msg=f"layer {layer}")


def test_generate_returns_hidden_states_per_step():
    model = tiny_model()
    prompt = torch.randint(1, 97, (1, 5))
    out = model.generate(
        prompt, max_new_tokens=3, do_sample=False, output_hidden_states=True, return_dict_in_generate=True
    )
    assert len(out.hidden_states) == 3
    assert [s[0].shape[1] for s in out.hidden_states] == [5, 1, 1]
    assert all(len(step) == model.config.num_hidden_layers + 1 for step in out.hidden_states)


def test_gradient_checkpointing_keeps_hidden_states_and_their_gradients():
    reference, checkpointed = tiny_model().train(), tiny_model().train()
    checkpointed.load_state_dict(reference.state_dict())
    checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tokens = torch.randint(0, 97, (2, 8))
    grads = []
    for model in (reference, checkpointed):
        states = model(tokens, use_cache=False, output_hidden_states=True).hidden_states
        sum(s.pow(2).mean() for s in states).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-8, atol=1e-10, msg=name)


# --- sequence parallelism: each rank's hidden states are those of its shard of the whole rows ---

SP_ROWS = [[5, 7, 2, 9, 1], [11, 2, 8, -3]]  # 24 tokens per row; a sample crosses the shard border


def _sp_hidden_states_worker(rank: int, world: int) -> dict[str, float]:
    from llamafactory_zebra.parallel import enable_sequence_parallel, new_layout, shard_batch

    torch.manual_seed(0)
    model = tiny_model(dtype=torch.float32, attn_implementation="sdpa")
    segments = packed_segments(SP_ROWS)
    batch = {
        "input_ids": torch.randint(1, 97, segments.shape, generator=torch.Generator().manual_seed(1)),
        "attention_mask": (segments != 0).long(),
        "position_ids": positions_from_segments(segments),
    }
    layout = new_layout(world)
    with torch.no_grad():
        whole = model(**batch, use_cache=False, output_hidden_states=True).hidden_states
        enable_sequence_parallel(model, layout)
        shard = model(**shard_batch(batch, layout), output_hidden_states=True).hidden_states
    piece = layout.shard(segments.shape[1])
    errors = {"layers": float(len(shard) == len(whole) == model.config.num_hidden_layers + 1)}
    real = segments[:, piece] != 0  # padding tokens' states are not defined by any sample
    for layer, (got, want) in enumerate(zip(shard, whole, strict=True)):
        errors[f"layer{layer}"] = (got - want[:, piece])[real].abs().max().item()
    return errors


@pytest.mark.slow
def test_sequence_parallel_hidden_states_are_the_shard_of_the_whole_rows():
    errors = worst(launch(_sp_hidden_states_worker, 2))
    assert errors.pop("layers") == 1.0
    assert errors == {key: pytest.approx(0.0, abs=1e-5) for key in errors}, errors


# --- value heads: LLaMA-Factory's reward model / PPO (trl's AutoModelForCausalLMWithValueHead) ---


def _lora(model):
    from peft import LoraConfig, get_peft_model

    targets = ["q_proj", "kv_a_proj_with_mqa", "out_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    config = LoraConfig(
        task_type="CAUSAL_LM", r=4, lora_alpha=8, target_modules=sorted(set(targets) & names), init_lora_weights=False
    )
    return get_peft_model(model, config)


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_value_head_reads_the_final_normed_states_and_trains(adapter):
    from trl import AutoModelForCausalLMWithValueHead

    base = tiny_model(dtype=torch.float32).train()
    wrapped = AutoModelForCausalLMWithValueHead.from_pretrained(_lora(base) if adapter == "lora" else base)
    tokens = torch.randint(1, 97, (3, 9))
    mask = torch.ones_like(tokens)
    mask[0, :3] = 0  # a left-padded prompt, as in a PPO batch

    wrapped.eval()  # no dropout: the independent reference is the backbone's last_hidden_state through the head
    with torch.no_grad():
        _, _, values = wrapped(input_ids=tokens, attention_mask=mask, use_cache=False)
        backbone = wrapped.pretrained_model.get_base_model() if adapter == "lora" else wrapped.pretrained_model
        final = backbone.model(tokens, attention_mask=mask, use_cache=False).last_hidden_state
        torch.testing.assert_close(values, wrapped.v_head(final).squeeze(-1), rtol=1e-5, atol=1e-6)

    wrapped.train()
    _, _, values = wrapped(input_ids=tokens, attention_mask=mask, use_cache=False)
    assert values.shape == (3, 9) and torch.isfinite(values).all()
    # A reward-model style pairwise loss on the last token of chosen (row 1) vs rejected (row 2).
    loss = -torch.nn.functional.logsigmoid(values[1, -1] - values[2, -1])
    loss.backward()
    assert torch.isfinite(loss)
    assert wrapped.v_head.summary.weight.grad.abs().sum() > 0
    trained = [p for n, p in wrapped.pretrained_model.named_parameters() if p.requires_grad]
    if adapter == "lora":
        assert trained and all("lora_" in n for n, p in wrapped.pretrained_model.named_parameters() if p.requires_grad)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trained)


def test_ppo_value_loss_on_a_synthetic_batch_goes_down():
    """PPO's critic step (clipped value loss against fixed returns) on the value-head model LLaMA-Factory's
    PPO builds; stock PPO itself is blocked by LLaMA-Factory 0.9.5's ``trl<=0.9.6`` pin."""
    from trl import AutoModelForCausalLMWithValueHead

    model = AutoModelForCausalLMWithValueHead.from_pretrained(_lora(tiny_model(dtype=torch.float32).train()))
    generator = torch.Generator().manual_seed(5)
    query_response = torch.randint(1, 97, (4, 12), generator=generator)
    mask = torch.ones_like(query_response)
    mask[:2, :3] = 0
    response = torch.zeros_like(mask, dtype=torch.bool)
    response[:, 7:] = True  # the response tokens, whose values the critic fits
    returns = torch.randn(4, 12, generator=generator)
    with torch.no_grad():
        old_values = model(input_ids=query_response, attention_mask=mask, use_cache=False)[2]
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(4):
        values = model(input_ids=query_response, attention_mask=mask, use_cache=False)[2]
        clipped = old_values + (values - old_values).clamp(-0.2, 0.2)
        loss = 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2)[response].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(map(torch.isfinite, map(torch.tensor, losses)))
    assert losses[-1] < losses[0], losses


def test_trl_get_reward_on_a_zebra_backbone_equals_unpadded_rows():
    """trl's current PPO reads values with ``trl.trainer.utils.get_reward`` (backbone + ``score`` head on
    ``hidden_states[-1]``, left-padded rows with positions counted from the first token)."""
    from trl.trainer.utils import get_reward

    class ValueModel(torch.nn.Module):
        base_model_prefix = "model"

        def __init__(self, lm):
            super().__init__()
            self.model = lm.model
            self.score = torch.nn.Linear(lm.config.hidden_size, 1, bias=False, dtype=torch.float64)

    value_model = ValueModel(tiny_model())
    short, long = torch.randint(1, 97, (1, 4)), torch.randint(1, 97, (1, 7))
    batch = torch.cat([torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1), long])
    with torch.no_grad():
        logits, _, _ = get_reward(value_model, batch, pad_token_id=0, context_length=3)
        alone = [value_model.score(value_model.model(r, use_cache=False).last_hidden_state) for r in (short, long)]
    torch.testing.assert_close(logits[0, 3:], alone[0][0], **TOLERANCE)
    torch.testing.assert_close(logits[1], alone[1][0], **TOLERANCE)

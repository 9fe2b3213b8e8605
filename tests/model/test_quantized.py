"""bitsandbytes 4-bit and 8-bit Zebras (transformers' ``BitsAndBytesConfig``): load from a saved checkpoint,
keep GDN's per-head gate projections unquantised, generate, and train a QLoRA adapter.

The tiny model here uses MLA ranks that are multiples of 64 (the released models' are): bitsandbytes'
4-bit CPU inference kernel needs each quantised layer's outputs in multiples of 32 and its inputs in
multiples of the 64-element quantisation block, which the default tiny preset's 48-wide MLA ranks are not.
"""

import pytest
import torch

from llamafactory_zebra import ZebraForCausalLM
from llamafactory_zebra.testing.models import tiny_config

bnb = pytest.importorskip("bitsandbytes")
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

KEPT = {"gdn.a_proj", "gdn.b_proj", "lm_head"}  # plain nn.Linear after quantisation (see _keep_in_fp32_modules)
QUANTISED_CLASS = {"4bit": bnb.nn.Linear4bit, "8bit": bnb.nn.Linear8bitLt}


def _config(kind: str) -> BitsAndBytesConfig:
    if kind == "4bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    return BitsAndBytesConfig(load_in_8bit=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    model = ZebraForCausalLM(tiny_config(q_lora_rank=64, kv_lora_rank=64, qk_rope_head_dim=32)).eval()
    path = tmp_path_factory.mktemp("zebra_bnb")
    model.save_pretrained(path)
    return path, model


def _linear_kinds(model) -> dict[str, str]:
    """``{module suffix: class name}`` for every linear layer ("gdn.a_proj", "mla.q_b_proj", "lm_head"…)."""
    kinds = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            suffix = ".".join(name.split(".")[-2:]) if ".layers." in name else name
            kinds.setdefault(suffix, set()).add(type(module).__name__)
    return {key: "/".join(sorted(value)) for key, value in kinds.items()}


@pytest.mark.parametrize("kind", ["4bit", "8bit"])
def test_quantised_load_keeps_the_gate_projections_and_everything_else_quantised(checkpoint, kind):
    path, _ = checkpoint
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=_config(kind))
    kinds = _linear_kinds(model)
    kept = {key for key, value in kinds.items() if value == "Linear"}
    assert kept == KEPT, kinds
    quantised_name = QUANTISED_CLASS[kind].__name__
    assert all(kinds[key] == quantised_name for key in set(kinds) - KEPT), kinds
    gdn = next(layer.gdn for layer in model.model.layers if hasattr(layer, "gdn"))
    # Never touched by bitsandbytes (it replaces nn.Linear only): decay parameters and short convolutions.
    assert gdn.A_log.dtype == gdn.dt_bias.dtype == torch.float32
    assert type(gdn.q_conv1d).__name__ == "ZebraShortConv"


def _dequantised_reference(quantised, original):
    """The fp32 model with each 4-bit layer's weight replaced by bitsandbytes' own dequantisation of it: the
    model the 4-bit one approximates up to rounding in the matmul, run through plain torch."""
    reference = ZebraForCausalLM(original.config).eval()
    reference.load_state_dict(original.state_dict())
    weights = dict(reference.named_modules())
    for name, module in quantised.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            dequantised = bnb.functional.dequantize_4bit(module.weight.data, module.weight.quant_state)
            weights[name].weight.data.copy_(dequantised.float())
    return reference


def test_4bit_forward_and_greedy_tokens_match_the_dequantised_fp32_model(checkpoint):
    path, original = checkpoint
    quantised = AutoModelForCausalLM.from_pretrained(path, quantization_config=_config("4bit"))
    reference = _dequantised_reference(quantised, original)  # before any forward repacks the 4-bit weights
    tokens = torch.randint(1, 97, (2, 13))
    with torch.no_grad():
        got = quantised(tokens, use_cache=False).logits.float().log_softmax(-1)
        want = reference(tokens, use_cache=False).logits.log_softmax(-1)
        unquantised = original(tokens, use_cache=False).logits.log_softmax(-1)
    # bitsandbytes' CPU kernel multiplies in bf16 (measured: 2.6e-3 here), the 4-bit rounding itself moves
    # the log-probs by ~0.1: the comparison tells the two apart.
    torch.testing.assert_close(got, want, rtol=0, atol=1e-2)
    assert (unquantised - want).abs().max() > 10 * (got - want).abs().max()

    prompt = tokens[:1, :5]
    generated = quantised.generate(prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(generated, reference.generate(prompt, max_new_tokens=8, do_sample=False))


def test_8bit_generates_the_fp32_models_greedy_tokens(checkpoint):
    """LLM.int8 quantises activations as well as weights (per row, to int8): on the tiny model its log-probs
    stay within 0.05 of fp32 (measured: 0.01), so greedy decoding keeps the same tokens."""
    path, original = checkpoint
    quantised = AutoModelForCausalLM.from_pretrained(path, quantization_config=_config("8bit"))
    tokens = torch.randint(1, 97, (2, 13))
    with torch.no_grad():
        got = quantised(tokens, use_cache=False).logits.float().log_softmax(-1)
        want = original(tokens, use_cache=False).logits.log_softmax(-1)
    torch.testing.assert_close(got, want, rtol=0, atol=0.05)
    prompt = tokens[:1, :5]
    generated = quantised.generate(prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(generated, original.generate(prompt, max_new_tokens=8, do_sample=False))


@pytest.mark.parametrize("kind", ["4bit", "8bit"])
def test_qlora_training_step_then_generation(checkpoint, kind):
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    path, _ = checkpoint
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=_config(kind))
    model = prepare_model_for_kbit_training(
        model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False}
    )
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "q_b_proj", "kv_b_proj", "out_proj", "gate_proj", "down_proj"]
    model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, target_modules=targets))
    model.train()
    tokens = torch.randint(1, 97, (2, 11))
    loss = model(input_ids=tokens, labels=tokens, use_cache=False).loss
    loss.backward()
    assert torch.isfinite(loss)
    adapters = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in n for n in adapters)
    # lora_B starts at zero, so the first step's gradient reaches lora_B (lora_A's waits for B to move).
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in adapters.items() if "lora_B" in n)
    assert not any(p.grad is not None for n, p in model.named_parameters() if not p.requires_grad)

    model.eval()
    out = model.generate(input_ids=tokens[:1, :4], max_new_tokens=5, do_sample=False)
    assert out.shape == (1, 9)


def test_fp16_load_keeps_the_gate_projections_in_fp32(checkpoint):
    """transformers upcasts ``_keep_in_fp32_modules`` when a model loads in fp16; the layer casts its input."""
    path, original = checkpoint
    model = ZebraForCausalLM.from_pretrained(path, dtype=torch.float16).eval()
    gdn = next(layer.gdn for layer in model.model.layers if hasattr(layer, "gdn"))
    assert gdn.a_proj.weight.dtype == gdn.b_proj.weight.dtype == torch.float32
    assert gdn.q_proj.weight.dtype == torch.float16
    tokens = torch.randint(1, 97, (1, 9))
    with torch.no_grad():
        half = model(tokens, use_cache=False).logits.float().log_softmax(-1)
        full = original(tokens, use_cache=False).logits.log_softmax(-1)
    torch.testing.assert_close(half, full, rtol=0, atol=2e-2)

"""bitsandbytes 4-bit on every shipped preset: the linear layers whose shapes its 4-bit kernel cannot take
stay unquantised automatically (``quantization.py``), and the load names them.

The ``tiny`` preset (the quickstart's model, 48-wide MLA ranks) loads in 4-bit and generates the tokens
of the fp32 model carrying bitsandbytes' own dequantised weights. The released presets are too big to
load here, so the rule is checked on their shapes: every shape the rule lets bitsandbytes quantise runs
through a real ``Linear4bit`` on CPU, and every shape it keeps out fails there.
"""

import logging

import pytest
import torch

from llamafactory_zebra import ZebraConfig, ZebraForCausalLM
from llamafactory_zebra.inventory import meta_model
from llamafactory_zebra.presets import PRESETS
from llamafactory_zebra.quantization import bnb_4bit_unfit_linears

bnb = pytest.importorskip("bitsandbytes")
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

NF4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    model = ZebraForCausalLM(ZebraConfig.from_preset("tiny")).eval()
    path = tmp_path_factory.mktemp("zebra_tiny_4bit")
    model.save_pretrained(path)
    return path, model


def _dequantised_reference(quantised, original):
    """The fp32 model with each 4-bit layer's weight replaced by bitsandbytes' dequantisation of it."""
    reference = ZebraForCausalLM(original.config).eval()
    reference.load_state_dict(original.state_dict())
    modules = dict(reference.named_modules())
    for name, module in quantised.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            dequantised = bnb.functional.dequantize_4bit(module.weight.data, module.weight.quant_state)
            modules[name].weight.data.copy_(dequantised.float())
    return reference


def test_tiny_preset_loads_in_4bit_names_the_kept_layers_and_generates(tiny_checkpoint, caplog):
    path, original = tiny_checkpoint
    unfit = set(bnb_4bit_unfit_linears(original)) - {"lm_head"}
    assert any(".mla." in name for name in unfit)  # the preset's 48-wide MLA ranks: the case this is for
    with caplog.at_level(logging.WARNING, logger="llamafactory_zebra.quantization"):
        quantised = AutoModelForCausalLM.from_pretrained(path, quantization_config=NF4)
    message = next(r.getMessage() for r in caplog.records if "stay unquantised" in r.getMessage())
    # The GDN gates are the class's own rule (kept for precision), named by neither the rule nor the warning.
    gates = {name for name in unfit if name.endswith(("gdn.a_proj", "gdn.b_proj"))}
    assert gates and all(name in message for name in unfit - gates)
    assert not any(name in message for name in gates)
    for name, module in quantised.named_modules():
        if isinstance(module, torch.nn.Linear) and name != "lm_head":
            assert isinstance(module, bnb.nn.Linear4bit) == (name not in unfit), name
    reference = _dequantised_reference(quantised, original)  # before a forward repacks the 4-bit weights
    prompt = torch.randint(1, 1024, (1, 6))
    generated = quantised.generate(prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(generated, reference.generate(prompt, max_new_tokens=8, do_sample=False))


def test_a_load_without_4bit_keeps_the_class_list():
    config = ZebraConfig.from_preset("tiny")
    assert ZebraForCausalLM(config)._keep_in_fp32_modules == {"gdn.a_proj", "gdn.b_proj"}


def _linear_shapes() -> dict[tuple[int, int], bool]:
    """``(in, out)`` of every quantisable linear of every shipped preset → whether the rule keeps it out."""
    shapes = {}
    for preset in PRESETS:
        model = meta_model(ZebraConfig.from_preset(preset))
        unfit = set(bnb_4bit_unfit_linears(model))
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name != "lm_head":
                shapes[(module.in_features, module.out_features)] = name in unfit
    return shapes


def _runs_in_4bit(in_features: int, out_features: int) -> bool:
    layer = bnb.nn.Linear4bit(in_features, out_features, bias=False, compute_dtype=torch.float32, quant_type="nf4")
    layer.weight = bnb.nn.Params4bit(torch.randn(out_features, in_features) / 8, requires_grad=False, quant_type="nf4")
    layer = layer.to("cpu").eval()  # quantises
    try:
        with torch.no_grad():
            layer(torch.randn(1, in_features))
    except (AssertionError, RuntimeError):
        return False
    return True


def test_every_shipped_presets_4bit_layers_fit_the_kernel_and_the_kept_ones_do_not():
    probe = bnb.nn.Linear4bit(64, 48, bias=False, compute_dtype=torch.float32, quant_type="nf4")
    if not getattr(probe, "support_avx512bf16_for_cpu", False):
        pytest.skip(
            "this CPU lacks AVX512-BF16: bitsandbytes' packed 4-bit CPU kernel (whose shapes the rule is for) "
            "is not used"
        )
    shapes = _linear_shapes()
    assert not all(shapes.values()) and any(shapes.values())
    outcome = {shape: _runs_in_4bit(*shape) for shape in shapes}
    assert {shape: not runs for shape, runs in outcome.items()} == shapes

"""LLaMA-Factory 0.9.5's own model tests, restated for the Zebra's module names, layer count and dtypes.

Each test below is one of ``tests/model/test_freeze.py``, ``test_lora.py``, ``test_full.py``, ``test_base.py``
and ``tests/model/model_utils/test_checkpointing.py`` at tag v0.9.5, with the same arguments (``fp16: true``,
the same finetuning options) and LLaMA-Factory's own helpers (``llamafactory.train.test_utils``), on
stand-ins built as LLaMA-Factory's hub ones are: a tiny random model saved in fp16, a LoRA adapter of it on
every linear layer, and a trl value-head checkpoint of it. What differs from LLaMA-Factory's file is only
what it hard-codes for its tiny Llama:

- names: LoRA's ``all`` targets are the Zebra's linears (GDN ``q/k/v/a/b/g/o_proj``, MLA ``q_a/q_b/
  kv_a_proj_with_mqa/kv_b/out_proj``, the MLP's), and ``freeze_trainable_layers: 1`` trains layer 3 of the
  tiny Zebra's 4 (the Llama has 2);
- dtypes: GDN's gate projections (``gdn.a_proj``, ``gdn.b_proj``) stay fp32 in an fp16 model by design
  (``ZebraPreTrainedModel._keep_in_fp32_modules``), where LLaMA-Factory expects every frozen weight in fp16.

When a LLaMA-Factory release changes these tests, restate the changed ones here the same way; how to run
LLaMA-Factory's own suite on a Zebra is in docs/llamafactory.md.
"""

from __future__ import annotations

import pytest
import torch
from llamafactory.extras.misc import get_current_device
from llamafactory.train.test_utils import (
    check_lora_model,
    compare_model,
    load_infer_model,
    load_reference_model,
    load_train_model,
    patch_valuehead_model,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LAST_LAYER = "model.layers.3."  # the tiny preset has 4 layers: gdn, mla, gdn, gdn
FP32_GATES = ("gdn.a_proj", "gdn.b_proj")
ZEBRA_LINEARS = {
    *("q_proj", "k_proj", "v_proj", "a_proj", "b_proj", "g_proj", "o_proj"),  # GDN
    *("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "out_proj"),  # MLA
    *("gate_proj", "up_proj", "down_proj"),  # MLP
}


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    """LLaMA-Factory's hub stand-ins for the Zebra: ``TINY_LLAMA3`` (fp16, with the value head its reward
    stage saves beside the weights), ``TINY_LLAMA_ADAPTER`` (LoRA of rank 8, LLaMA-Factory's default, on every
    linear) and ``TINY_LLAMA_VALUEHEAD`` (trl's value-head format: ``v_head.summary.*`` in ``model.safetensors``)."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    from trl import AutoModelForCausalLMWithValueHead

    from llamafactory_zebra.cli.init_cmd import write_random_model

    root = tmp_path_factory.mktemp("lf_contract")
    base = write_random_model("tiny", root / "zebra", seed=5, dtype="float16")
    torch.manual_seed(5)
    valuehead = AutoModelForCausalLMWithValueHead.from_pretrained(str(base), dtype=torch.float16)
    valuehead.save_pretrained(root / "valuehead")
    head = {f"v_head.{name}": tensor.contiguous() for name, tensor in valuehead.v_head.state_dict().items()}
    save_file(head, base / "value_head.safetensors")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    adapter = get_peft_model(model, LoraConfig(r=8, target_modules=sorted(ZEBRA_LINEARS), init_lora_weights=False))
    adapter.save_pretrained(root / "adapter")
    return {"model": str(base), "adapter": str(root / "adapter"), "valuehead": str(root / "valuehead")}


def _train_args(stand_ins, tmp_path, finetuning_type, **extra):
    return {
        "model_name_or_path": stand_ins["model"],
        "stage": "sft",
        "do_train": True,
        "finetuning_type": finetuning_type,
        "dataset": "llamafactory/tiny-supervised-dataset",
        "dataset_dir": "ONLINE",
        "template": "zebra",
        "cutoff_len": 1024,
        "output_dir": str(tmp_path / "dummy_dir"),
        "overwrite_output_dir": True,
        "fp16": True,
        **extra,
    }


def _infer_args(stand_ins, finetuning_type, **extra):
    return {
        "model_name_or_path": stand_ins["model"],
        "finetuning_type": finetuning_type,
        "template": "zebra",
        "infer_dtype": "float16",
        **extra,
    }


def _frozen_dtype(name: str) -> torch.dtype:
    return torch.float32 if any(f"{gate}." in name for gate in FP32_GATES) else torch.float16


@pytest.fixture
def fix_valuehead_cpu_loading(monkeypatch):
    """LLaMA-Factory's conftest fixture of the same name, undone after the test."""
    from trl import AutoModelForCausalLMWithValueHead

    monkeypatch.setattr(AutoModelForCausalLMWithValueHead, "post_init", AutoModelForCausalLMWithValueHead.post_init)
    patch_valuehead_model()


# tests/model/test_freeze.py


def test_freeze_train_all_modules(stand_ins, tmp_path):
    model = load_train_model(**_train_args(stand_ins, tmp_path, "freeze", freeze_trainable_layers=1))
    for name, param in model.named_parameters():
        if name.startswith(LAST_LAYER):
            assert param.requires_grad is True, name
            assert param.dtype == torch.float32, name
        else:
            assert param.requires_grad is False, name
            assert param.dtype == _frozen_dtype(name), name


def test_freeze_train_extra_modules(stand_ins, tmp_path):
    args = _train_args(
        stand_ins, tmp_path, "freeze", freeze_trainable_layers=1, freeze_extra_modules="embed_tokens,lm_head"
    )
    model = load_train_model(**args)
    for name, param in model.named_parameters():
        if name.startswith(LAST_LAYER) or any(module in name for module in ["embed_tokens", "lm_head"]):
            assert param.requires_grad is True, name
            assert param.dtype == torch.float32, name
        else:
            assert param.requires_grad is False, name
            assert param.dtype == _frozen_dtype(name), name


def _check_frozen_for_inference(model) -> None:
    """Every parameter frozen, in fp16 but the GDN gates (fp32 by design)."""
    for name, param in model.named_parameters():
        assert param.requires_grad is False, name
        assert param.dtype == _frozen_dtype(name), name


def test_freeze_inference(stand_ins):
    _check_frozen_for_inference(load_infer_model(**_infer_args(stand_ins, "freeze")))


# tests/model/test_lora.py


def _check_lora_model(model):
    """``check_lora_model`` with the fp32 gates: LLaMA-Factory's helper, on a copy whose frozen gates read as
    fp16, so every other assertion of it holds as written."""
    gates = [param for name, param in model.named_parameters() if not param.requires_grad and "proj" in name]
    gates = [param for param in gates if param.dtype == torch.float32]
    names = {id(param): name for name, param in model.named_parameters()}
    assert all(any(f"{gate}." in names[id(param)] for gate in FP32_GATES) for param in gates)
    assert gates, "the GDN gates were expected in fp32"
    for param in gates:
        param.data = param.data.to(torch.float16)
    return check_lora_model(model)


def test_lora_train_qv_modules(stand_ins, tmp_path):
    model = load_train_model(**_train_args(stand_ins, tmp_path, "lora", lora_target="q_proj,v_proj"))
    linear_modules, _ = _check_lora_model(model)
    assert linear_modules == {"q_proj", "v_proj"}


def test_lora_train_mla_modules(stand_ins, tmp_path):
    """The MLA layer's query and key/value up-projections: the Zebra's q_proj/v_proj in attention."""
    model = load_train_model(**_train_args(stand_ins, tmp_path, "lora", lora_target="q_b_proj,kv_b_proj"))
    linear_modules, _ = _check_lora_model(model)
    assert linear_modules == {"q_b_proj", "kv_b_proj"}


def test_lora_train_all_modules(stand_ins, tmp_path):
    model = load_train_model(**_train_args(stand_ins, tmp_path, "lora", lora_target="all"))
    linear_modules, _ = _check_lora_model(model)
    assert linear_modules == ZEBRA_LINEARS


def test_lora_train_extra_modules(stand_ins, tmp_path):
    model = load_train_model(**_train_args(stand_ins, tmp_path, "lora", additional_target="embed_tokens,lm_head"))
    _, extra_modules = _check_lora_model(model)
    assert extra_modules == {"embed_tokens", "lm_head"}


def test_lora_train_old_adapters(stand_ins, tmp_path):
    adapter = stand_ins["adapter"]
    args = _train_args(stand_ins, tmp_path, "lora", adapter_name_or_path=adapter, create_new_adapter=False)
    model = load_train_model(**args)
    ref_model = load_reference_model(stand_ins["model"], stand_ins["adapter"], use_lora=True, is_trainable=True)
    compare_model(model, ref_model)


def test_lora_train_new_adapters(stand_ins, tmp_path):
    adapter = stand_ins["adapter"]
    args = _train_args(stand_ins, tmp_path, "lora", adapter_name_or_path=adapter, create_new_adapter=True)
    model = load_train_model(**args)
    ref_model = load_reference_model(stand_ins["model"], stand_ins["adapter"], use_lora=True, is_trainable=True)
    compare_model(model, ref_model, diff_keys=sorted(ZEBRA_LINEARS))


@pytest.mark.usefixtures("fix_valuehead_cpu_loading")
def test_lora_train_valuehead(stand_ins, tmp_path):
    model = load_train_model(add_valuehead=True, **_train_args(stand_ins, tmp_path, "lora"))
    ref_model = load_reference_model(stand_ins["valuehead"], is_trainable=True, add_valuehead=True)
    state_dict = model.state_dict()
    ref_state_dict = ref_model.state_dict()
    assert torch.allclose(state_dict["v_head.summary.weight"], ref_state_dict["v_head.summary.weight"])
    assert torch.allclose(state_dict["v_head.summary.bias"], ref_state_dict["v_head.summary.bias"])


def test_lora_inference(stand_ins):
    model = load_infer_model(**_infer_args(stand_ins, "lora", adapter_name_or_path=stand_ins["adapter"]))
    ref_model = load_reference_model(stand_ins["model"], stand_ins["adapter"], use_lora=True).merge_and_unload()
    compare_model(model, ref_model)


# tests/model/test_full.py


def test_full_train(stand_ins, tmp_path):
    model = load_train_model(**_train_args(stand_ins, tmp_path, "full"))
    for name, param in model.named_parameters():
        assert param.requires_grad is True, name
        assert param.dtype == torch.float32, name


def test_full_inference(stand_ins):
    _check_frozen_for_inference(load_infer_model(**_infer_args(stand_ins, "full")))


# tests/model/test_base.py


def test_base(stand_ins):
    model = load_infer_model(**_infer_args(stand_ins, "lora"))
    ref_model = load_reference_model(stand_ins["model"])
    compare_model(model, ref_model)


@pytest.mark.usefixtures("fix_valuehead_cpu_loading")
def test_valuehead(stand_ins):
    model = load_infer_model(add_valuehead=True, **_infer_args(stand_ins, "lora"))
    ref_model = load_reference_model(stand_ins["valuehead"], add_valuehead=True)
    compare_model(model, ref_model)


# tests/model/model_utils/test_checkpointing.py


@pytest.mark.parametrize("disable_gradient_checkpointing", [False, True])
def test_vanilla_checkpointing(stand_ins, tmp_path, disable_gradient_checkpointing):
    args = _train_args(
        stand_ins, tmp_path, "lora", lora_target="all", disable_gradient_checkpointing=disable_gradient_checkpointing
    )
    model = load_train_model(**args)
    modules = [module for module in model.modules() if hasattr(module, "gradient_checkpointing")]
    assert modules
    for module in modules:
        assert module.gradient_checkpointing != disable_gradient_checkpointing


def test_unsloth_gradient_checkpointing(stand_ins, tmp_path):
    model = load_train_model(**_train_args(stand_ins, tmp_path, "lora", lora_target="all", use_unsloth_gc=True))
    modules = [module for module in model.modules() if hasattr(module, "gradient_checkpointing")]
    assert modules
    for module in modules:
        assert module._gradient_checkpointing_func.__self__.__name__ == "UnslothGradientCheckpointing"


def test_upcast_layernorm(stand_ins, tmp_path):
    model = load_train_model(**_train_args(stand_ins, tmp_path, "lora", lora_target="all", upcast_layernorm=True))
    norms = [(name, param) for name, param in model.named_parameters() if param.ndim == 1 and "norm" in name]
    assert {name.split(".")[-2] for name, _ in norms} >= {"input_layernorm", "o_norm", "q_norm", "k_norm", "norm"}
    for name, param in norms:
        assert param.dtype == torch.float32, name


def test_upcast_lmhead_output(stand_ins, tmp_path):
    model = load_train_model(**_train_args(stand_ins, tmp_path, "lora", lora_target="all", upcast_lmhead_output=True))
    inputs = torch.randn((1, 64), dtype=torch.float16, device=get_current_device())  # the tiny hidden size
    outputs: torch.Tensor = model.get_output_embeddings()(inputs)
    assert outputs.dtype == torch.float32


# stage: ppo (LLaMA-Factory has no PPO test; docs/llamafactory.md, "Stages × methods × backends", footnote 2)


def test_llamafactory_ppo_is_still_blocked_upstream():
    """LLaMA-Factory 0.9.5's PPO trainer refuses every trl its other trainers import (>= 0.18) before it reads
    its arguments, and trl's PPOConfig has dropped the arguments it passes. When this fails, PPO may run: add
    the ``stage: ppo`` runs (Zebra policy; reward models full and LoRA, Zebra and dense) to
    test_llamafactory_stages.py and update the docs' footnote."""
    from llamafactory.train.ppo.trainer import CustomPPOTrainer
    from trl import PPOConfig

    with pytest.raises(ImportError, match=r"trl>=0\.8\.6,<=0\.9\.6 is required"):
        CustomPPOTrainer(*[None] * 12)
    with pytest.raises(TypeError, match="model_name"):
        PPOConfig(model_name="policy", ppo_epochs=4, optimize_device_cache=True)

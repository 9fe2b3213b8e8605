"""Guard rails at training start, called with LLaMA-Factory's real argument dataclasses."""

import json
import math
import os
import types

import pytest
import torch

from llamafactory_zebra.configuration_zebra import ZebraConfig
from llamafactory_zebra.integration.guards import MIN_WARMUP_STEPS, check_training_setup, training_steps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZEBRA = ZebraConfig.from_preset("tiny")


@pytest.fixture(autouse=True)
def _no_leaked_deepspeed_state():
    """A DeepSpeed config object makes transformers believe ZeRO-3 is on (a global weakref) and
    TrainingArguments exports ACCELERATE_USE_DEEPSPEED; neither may leak into other tests."""
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    environment = dict(os.environ)
    yield
    unset_hf_deepspeed_config()
    os.environ.clear()
    os.environ.update(environment)


def _args(tmp_path, **training):
    """LLaMA-Factory's parsed arguments for a small SFT run (``use_cpu`` so bf16 parses without a GPU)."""
    from llamafactory.hparams import DataArguments, FinetuningArguments, ModelArguments, TrainingArguments
    from transformers import HfArgumentParser

    values = {
        "model_name_or_path": "unused",
        "stage": "sft",
        "do_train": True,
        "dataset": "identity",
        "template": "qwen3",
        "cutoff_len": 1048576,
        "output_dir": str(tmp_path / "out"),
        "use_cpu": True,
        "report_to": "none",
        **training,
    }
    parser = HfArgumentParser([ModelArguments, DataArguments, TrainingArguments, FinetuningArguments])
    model_args, data_args, training_args, finetuning_args = parser.parse_dict(values)
    return model_args, data_args, training_args, finetuning_args


def test_fp16_is_refused_on_rocm_only(tmp_path):
    model_args, data_args, training_args, finetuning_args = _args(tmp_path, fp16=True)
    with pytest.raises(ValueError, match="bf16 only.*fp16: true"):
        check_training_setup(model_args, data_args, training_args, finetuning_args, ZEBRA, is_rocm=True)
    assert check_training_setup(model_args, data_args, training_args, finetuning_args, ZEBRA, is_rocm=False) == []


def test_rocm_is_detected_from_torch_version_hip(tmp_path, monkeypatch):
    args = _args(tmp_path, fp16=True)
    monkeypatch.setattr(torch.version, "hip", None)
    assert check_training_setup(*args, ZEBRA) == []
    monkeypatch.setattr(torch.version, "hip", "6.4.43482")
    with pytest.raises(ValueError, match="bf16 only"):
        check_training_setup(*args, ZEBRA)


def test_fp16_in_the_deepspeed_json_is_refused_on_rocm(tmp_path):
    with open(os.path.join(ROOT, "deepspeed_configs", "ds_z2_bf16.json")) as f:
        config = json.load(f)
    config["fp16"], config["bf16"] = {"enabled": True}, {"enabled": False}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    args = _args(tmp_path, fp16=True, deepspeed=str(tmp_path / "ds.json"))
    with pytest.raises(ValueError, match="fp16"):
        check_training_setup(*args, ZEBRA, is_rocm=True)


def test_bf16_on_rocm_passes(tmp_path):
    assert check_training_setup(*_args(tmp_path, bf16=True), ZEBRA, is_rocm=True) == []


def test_warmup_ratio_that_leaves_almost_no_warmup_warns(tmp_path):
    args = _args(tmp_path, bf16=True, warmup_ratio=0.1, per_device_train_batch_size=2, num_train_epochs=1)
    # 40 packed 1M-token sequences, batch 2, one rank: 20 optimizer steps, ceil(2.0) = 2 warmup steps
    (warning,) = check_training_setup(*args, ZEBRA, num_train_examples=40, is_rocm=True)
    assert "2 warmup step(s) of 20" in warning and "warmup_steps" in warning
    assert check_training_setup(*args, ZEBRA, num_train_examples=4000, is_rocm=True) == []
    assert check_training_setup(*args, ZEBRA, is_rocm=True) == []  # steps unknown: nothing to check


def test_warmup_from_max_steps_and_absolute_warmup(tmp_path):
    (warning,) = check_training_setup(*_args(tmp_path, warmup_ratio=0.05, max_steps=30), ZEBRA)
    assert "2 warmup step(s) of 30" in warning and str(MIN_WARMUP_STEPS) in warning
    assert check_training_setup(*_args(tmp_path, warmup_steps=200, max_steps=30), ZEBRA) == []


class _LengthOnly(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return index


@pytest.mark.parametrize("examples,batch,accumulation,epochs", [(40, 2, 1, 1.0), (41, 2, 4, 3.0), (7, 4, 2, 1.5)])
def test_step_count_is_the_trainers(tmp_path, examples, batch, accumulation, epochs):
    """Our count against ``Trainer.set_initial_training_values`` itself, on a real DataLoader."""
    from transformers import Trainer

    _, _, training_args, _ = _args(
        tmp_path, per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation, num_train_epochs=epochs
    )
    loader = torch.utils.data.DataLoader(_LengthOnly(examples), batch_size=batch)
    trainer = types.SimpleNamespace(
        get_total_train_batch_size=lambda args: batch * accumulation,
        get_sp_size=lambda: 1,
        num_examples=lambda dataloader: examples,
    )
    _, _, _, _, _, _, max_steps = Trainer.set_initial_training_values(trainer, training_args, loader)
    assert (
        training_steps(training_args, examples)
        == max_steps
        == math.ceil(epochs * math.ceil(math.ceil(examples / batch) / accumulation))
    )


def test_zero3_without_gathered_save_warns(tmp_path):
    with open(os.path.join(ROOT, "deepspeed_configs", "ds_z3_bf16.json")) as f:
        config = json.load(f)
    (tmp_path / "ok.json").write_text(json.dumps(config))
    del config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"]
    (tmp_path / "empty_save.json").write_text(json.dumps(config))

    (warning,) = check_training_setup(*_args(tmp_path, bf16=True, deepspeed=str(tmp_path / "empty_save.json")), ZEBRA)
    assert "stage3_gather_16bit_weights_on_model_save" in warning and "empty" in warning
    assert check_training_setup(*_args(tmp_path, bf16=True, deepspeed=str(tmp_path / "ok.json")), ZEBRA) == []
    z2 = os.path.join(ROOT, "deepspeed_configs", "ds_z2_bf16.json")
    assert check_training_setup(*_args(tmp_path, bf16=True, deepspeed=z2), ZEBRA) == []


def test_other_models_are_left_alone(tmp_path):
    args = _args(tmp_path, fp16=True, warmup_ratio=0.1, max_steps=5)
    assert check_training_setup(*args, types.SimpleNamespace(model_type="qwen3"), is_rocm=True) == []

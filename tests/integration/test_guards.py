"""Guard rails at training start, called with LLaMA-Factory's real argument dataclasses."""

import json
import math
import os
import re
import types

import pytest
import torch
from llamafactory_cli import free_port
from repo_paths import REPO
from training_runs import training_run

from llamafactory_zebra.configuration_zebra import ZebraConfig
from llamafactory_zebra.integration.guards import MIN_WARMUP_STEPS, check_training_setup, optimizer_steps

ZEBRA = ZebraConfig.from_preset("tiny")


pytestmark = pytest.mark.usefixtures("no_leaked_deepspeed_state")


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


def _check(args, config=ZEBRA, arguments="the training arguments", **options):
    """``check_training_setup`` on the run object the pipeline builds from these arguments."""
    return check_training_setup(training_run(*args, config=config, source=arguments), **options)


def test_fp16_is_refused_on_rocm_only(tmp_path):
    model_args, data_args, training_args, finetuning_args = _args(tmp_path, fp16=True)
    with pytest.raises(ValueError, match="bf16 only.*fp16: true"):
        _check((model_args, data_args, training_args, finetuning_args), is_rocm=True)
    assert _check((model_args, data_args, training_args, finetuning_args), is_rocm=False) == []


def test_rocm_is_detected_from_the_torch_build(tmp_path, monkeypatch):
    """The machine probe (``kernels.this_machine``) says whether torch is a ROCm build."""
    from llamafactory_zebra.integration import guards
    from llamafactory_zebra.kernels import Stack

    args = _args(tmp_path, fp16=True)
    monkeypatch.setattr(guards, "this_machine", lambda: Stack("cpu", toolkit="CUDA 13.0"))
    assert _check(args) == []
    monkeypatch.setattr(guards, "this_machine", lambda: Stack("cpu", toolkit="ROCm 6.4.43482"))
    with pytest.raises(ValueError, match="bf16 only"):
        _check(args)


def test_fp16_in_the_deepspeed_json_is_refused_on_rocm(tmp_path):
    with open(os.path.join(REPO, "deepspeed_configs", "ds_z2_bf16.json")) as f:
        config = json.load(f)
    config["fp16"], config["bf16"] = {"enabled": True}, {"enabled": False}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    args = _args(tmp_path, fp16=True, deepspeed=str(tmp_path / "ds.json"))
    with pytest.raises(ValueError, match="fp16"):
        _check(args, is_rocm=True)


def test_bf16_on_rocm_passes(tmp_path):
    assert _check(_args(tmp_path, bf16=True), is_rocm=True) == []


def test_warmup_ratio_that_leaves_almost_no_warmup_warns(tmp_path):
    args = _args(tmp_path, bf16=True, warmup_ratio=0.1, per_device_train_batch_size=2, num_train_epochs=1)
    # 40 packed 1M-token sequences, batch 2, one rank: 20 optimizer steps, ceil(2.0) = 2 warmup steps
    (warning,) = _check(args, num_train_examples=40, is_rocm=True)
    assert "2 warmup step(s) of 20" in warning and "warmup_steps" in warning
    assert _check(args, num_train_examples=4000, is_rocm=True) == []
    assert _check(args, is_rocm=True) == []  # steps unknown: nothing to check


def test_warmup_from_max_steps_and_absolute_warmup(tmp_path):
    (warning,) = _check(_args(tmp_path, warmup_ratio=0.05, max_steps=30))
    assert "2 warmup step(s) of 30" in warning and str(MIN_WARMUP_STEPS) in warning
    assert _check(_args(tmp_path, warmup_steps=200, max_steps=30)) == []


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
        optimizer_steps(training_args, examples)
        == max_steps
        == math.ceil(epochs * math.ceil(math.ceil(examples / batch) / accumulation))
    )


def test_zero3_without_gathered_save_warns(tmp_path):
    with open(os.path.join(REPO, "deepspeed_configs", "ds_z3_bf16.json")) as f:
        config = json.load(f)
    (tmp_path / "ok.json").write_text(json.dumps(config))
    del config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"]
    (tmp_path / "empty_save.json").write_text(json.dumps(config))

    (warning,) = _check(_args(tmp_path, bf16=True, deepspeed=str(tmp_path / "empty_save.json")))
    assert "stage3_gather_16bit_weights_on_model_save" in warning and "empty" in warning
    assert _check(_args(tmp_path, bf16=True, deepspeed=str(tmp_path / "ok.json"))) == []
    z2 = os.path.join(REPO, "deepspeed_configs", "ds_z2_bf16.json")
    assert _check(_args(tmp_path, bf16=True, deepspeed=z2)) == []


def test_other_models_are_left_alone(tmp_path):
    args = _args(tmp_path, fp16=True, warmup_ratio=0.1, max_steps=5)
    assert _check(args, types.SimpleNamespace(model_type="qwen3"), is_rocm=True) == []


def _write_deepspeed(tmp_path, name, **changes):
    """A user's copy of the ZeRO-3 preset with some values set by hand (dotted keys)."""
    with open(os.path.join(REPO, "deepspeed_configs", "ds_z3_bf16.json")) as f:
        config = json.load(f)
    for dotted, value in changes.items():
        node = config
        *parents, leaf = dotted.split("__")
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def _transformers_mismatched_keys(training_args, num_training_steps):
    """The keys transformers itself refuses when the trainer starts (``trainer_config_finalize``)."""
    hf_config = training_args.hf_deepspeed_config
    model = types.SimpleNamespace(config=ZEBRA)
    try:
        hf_config.trainer_config_finalize(training_args, model, num_training_steps)
    except ValueError as err:
        return set(re.findall(r"^- ds (\S+)=", str(err), re.MULTILINE))
    return set()


HAND_SET = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 8,
    "train_batch_size": 99,
    "gradient_clipping": 0.5,
    "optimizer__type": "AdamW",
    "optimizer__params__lr": 1.0e-4,
    "optimizer__params__betas": [0.9, 0.95],
    "optimizer__params__eps": 1.0e-6,
    "optimizer__params__weight_decay": 0.1,
    "scheduler__type": "WarmupDecayLR",
    "scheduler__params__warmup_max_lr": 1.0e-4,
    "scheduler__params__total_num_steps": 1000,
    "scheduler__params__warmup_num_steps": 50,
    "fp16__enabled": True,
    "bf16__enabled": True,
}


def test_every_deepspeed_conflict_transformers_raises_at_trainer_start_is_refused_at_parsing(tmp_path):
    """Each hand-set value disagrees with the YAML: the guard names exactly the keys transformers would."""
    from llamafactory_zebra.integration.config_conflicts import deepspeed_conflicts

    deepspeed = _write_deepspeed(tmp_path, "user_ds.json", **HAND_SET)
    _, _, training_args, _ = _args(tmp_path, deepspeed=deepspeed, max_steps=30, warmup_steps=3)
    lines = deepspeed_conflicts(training_args, "train.yaml")
    ours = {re.match(r"- \S+ has (\S+) = ", line).group(1) for line in lines}
    assert ours == _transformers_mismatched_keys(training_args, 30)
    assert ours == {key.replace("__", ".") for key in HAND_SET if "type" not in key}
    clipping = next(line for line in lines if " gradient_clipping = " in line)
    assert clipping.startswith(f"- {deepspeed} has gradient_clipping = 0.5, but train.yaml sets max_grad_norm: 1.0.")
    assert 'set gradient_clipping to "auto"' in clipping and "`max_grad_norm: 0.5`" in clipping
    bf16 = next(line for line in lines if " bf16.enabled = " in line)
    assert "train.yaml sets bf16 (or bf16_full_eval): false" in bf16 and "`bf16: true` in train.yaml" in bf16
    with pytest.raises(ValueError, match=re.escape(f"{deepspeed} conflicts with train.yaml")):
        _check(_args(tmp_path, deepspeed=deepspeed), arguments="train.yaml")


def test_auto_and_equal_values_pass_and_step_counts_wait_for_max_steps(tmp_path):
    from llamafactory_zebra.integration.config_conflicts import deepspeed_conflicts

    agreeing = _write_deepspeed(
        tmp_path, "agree.json", gradient_clipping=1.0, train_micro_batch_size_per_gpu=2, bf16__enabled=False
    )
    args = _args(tmp_path, deepspeed=agreeing, per_device_train_batch_size=2)
    assert _check(args) == []
    # Step counts: unknowable without max_steps (a warning), checked exactly with it.
    steps = _write_deepspeed(
        tmp_path, "steps.json", scheduler__type="WarmupDecayLR", scheduler__params__total_num_steps=40
    )
    (warning, fixed) = _check(_args(tmp_path, deepspeed=steps), arguments="t.yaml")
    assert '"scheduler" block (WarmupDecayLR)' in warning and "lr_scheduler_type" in warning
    assert "scheduler.params.total_num_steps" in fixed and "max_steps" in fixed
    _, _, with_steps, _ = _args(tmp_path, deepspeed=steps, max_steps=40)
    assert deepspeed_conflicts(with_steps, "t.yaml") == [] == list(with_steps.hf_deepspeed_config.mismatches)
    # auto_find_batch_size: transformers does not hold the micro batch to the YAML's value.
    batch = _write_deepspeed(tmp_path, "batch.json", train_micro_batch_size_per_gpu=16)
    _, _, auto_batch, _ = _args(tmp_path, deepspeed=batch, auto_find_batch_size=True)
    assert deepspeed_conflicts(auto_batch, "t.yaml") == []


def test_fa3_is_refused_before_llamafactory_fails_at_model_load(tmp_path):
    with pytest.raises(ValueError, match="flash_attn: fa3 is not supported.*fa2"):
        _check(_args(tmp_path, flash_attn="fa3"))
    assert _check(_args(tmp_path, flash_attn="sdpa")) == []


PARSE_EVERY_PRESET = r"""
import importlib, json, os, sys
# DeepSpeed's CPU collectives are a C++ build (a minute when not cached) that parsing does not use.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
from llamafactory.hparams import get_train_args

def attempt(case, yaml_path):
    sys.argv = ["llamafactory-cli", yaml_path]  # what `llamafactory-cli train YAML` hands a worker
    try:
        training_args = get_train_args()[2]
        bf16 = training_args.hf_deepspeed_config.config["bf16"]["enabled"]
        print("OUTCOME", json.dumps({"case": case, "bf16": bf16}))
    except ValueError as err:
        print("OUTCOME", json.dumps({"case": case, "error": str(err)}))

for case, yaml_path in json.loads(sys.argv[1]):
    attempt(case, yaml_path)
"""


@pytest.mark.slow
def test_llamafactory_get_train_args_with_every_shipped_preset(tmp_path):
    """LLaMA-Factory's real ``get_train_args`` (one rank of a torchrun world of one), shipped presets as they
    are: with ``bf16: false`` each parses to an fp32 DeepSpeed config; ``fp16: true`` and a user's hand-set
    bf16 are refused naming both files; ``flash_attn: fa3`` and a bad ``sequence_parallel_size`` too."""
    import subprocess
    import sys

    import yaml

    from llamafactory_zebra.cli.init_cmd import write_random_model

    model = write_random_model("tiny", tmp_path / "tiny", seed=3)
    base = {
        "model_name_or_path": str(model),
        "stage": "sft",
        "do_train": True,
        "dataset": "zebra_demo",
        "template": "zebra",
        "finetuning_type": "full",
        "output_dir": str(tmp_path / "out"),
        "overwrite_output_dir": True,
        "report_to": "none",
        "cutoff_len": 128,
        "bf16": False,
    }
    presets = sorted(os.listdir(os.path.join(REPO, "deepspeed_configs")))
    hand_set = _write_deepspeed(tmp_path, "mine.json", bf16__enabled=True, train_micro_batch_size_per_gpu=4)
    cases = {f"fp32 {name}": {"deepspeed": os.path.join(REPO, "deepspeed_configs", name)} for name in presets}
    cases["fp16"] = {**cases["fp32 ds_z3_bf16.json"], "fp16": True}
    cases["hand-set bf16"] = {"deepspeed": hand_set}
    cases["fa3"] = {"flash_attn": "fa3"}
    cases["sp 2 of 1 rank"] = {"sequence_parallel_size": 2}
    paths = []
    for index, (case, changes) in enumerate(cases.items()):
        path = tmp_path / f"train{index}.yaml"
        path.write_text(yaml.safe_dump({**base, **changes}))
        paths.append((case, str(path)))
    env = {
        **os.environ,
        "WORLD_SIZE": "1",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "DISABLE_VERSION_CHECK": "1",
    }
    result = subprocess.run(
        [sys.executable, "-c", PARSE_EVERY_PRESET, json.dumps(paths)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [line.removeprefix("OUTCOME ") for line in result.stdout.splitlines() if line.startswith("OUTCOME ")]
    outcomes = {outcome["case"]: outcome for outcome in map(json.loads, lines)}
    assert set(outcomes) == set(cases), result.stderr[-4000:]
    yaml_of = dict(paths)
    for name in presets:
        assert outcomes[f"fp32 {name}"] == {"case": f"fp32 {name}", "bf16": False}
    error = outcomes["fp16"]["error"]
    assert f"{cases['fp16']['deepspeed']} has fp16.enabled = false" in error
    assert f"{yaml_of['fp16']} sets fp16 (or fp16_full_eval): true" in error
    error = outcomes["hand-set bf16"]["error"]
    assert f"{hand_set} has bf16.enabled = true, but {yaml_of['hand-set bf16']} sets bf16" in error
    assert f"{hand_set} has train_micro_batch_size_per_gpu = 4" in error
    assert "fa3 is not supported" in outcomes["fa3"]["error"]
    assert "sequence_parallel_size" in outcomes["sp 2 of 1 rank"]["error"]

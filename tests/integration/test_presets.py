"""DeepSpeed and FSDP2 presets parse with DeepSpeed's / accelerate's own code; ROCm env files and launch
scripts say what docs/rocm.md says and export what ``llamafactory-cli train`` reads."""

import os
import re
import subprocess
import types
from unittest import mock

import pytest
from repo_paths import REPO

from llamafactory_zebra import ZebraConfig

# file -> (ZeRO stage, optimizer offloaded, parameters offloaded)
DEEPSPEED_PRESETS = {
    "ds_z3_bf16.json": (3, False, False),
    "ds_z3_bf16_offload_optimizer.json": (3, True, False),
    "ds_z3_bf16_offload_all.json": (3, True, True),
    "ds_z2_bf16.json": (2, False, False),
}
FSDP_PRESETS = {"fsdp2_zebra_bf16.yaml": False, "fsdp2_zebra_bf16_offload.yaml": True}


pytestmark = pytest.mark.usefixtures("no_leaked_deepspeed_state")


def test_every_preset_file_is_listed():
    assert sorted(os.listdir(os.path.join(REPO, "deepspeed_configs"))) == sorted(DEEPSPEED_PRESETS)
    assert sorted(os.listdir(os.path.join(REPO, "examples", "accelerate"))) == sorted(FSDP_PRESETS)


def _training_args(**overrides):
    from transformers import TrainingArguments

    values = dict(output_dir="unused", use_cpu=True, bf16=True, per_device_train_batch_size=2, report_to="none")
    values.update(overrides)
    return TrainingArguments(**values)


def _filled(path, args):
    """The config exactly as the HF Trainer hands it to DeepSpeed: every "auto" resolved."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    hf_config = HfTrainerDeepSpeedConfig(path)
    hf_config.trainer_config_process(args)
    model = types.SimpleNamespace(config=ZebraConfig.from_preset("qwen3-1.7b-7mla21gdn-1m"))
    hf_config.trainer_config_finalize(args, model, num_training_steps=100)
    return hf_config.config


@pytest.mark.parametrize("name", sorted(DEEPSPEED_PRESETS))
def test_deepspeed_preset_parses_with_deepspeed(name):
    from deepspeed.runtime.config import DeepSpeedConfig

    config = _filled(os.path.join(REPO, "deepspeed_configs", name), _training_args())
    assert "auto" not in repr(config)
    parsed = DeepSpeedConfig(config)
    stage, offload_optimizer, offload_params = DEEPSPEED_PRESETS[name]
    zero = parsed.zero_config
    assert parsed.zero_optimization_stage == stage
    assert parsed.bfloat16_config.enabled and not parsed.float16_config.enabled
    assert zero.overlap_comm is False
    assert (zero.offload_optimizer is not None) == offload_optimizer
    assert (zero.offload_param is not None) == offload_params
    if stage == 3:
        assert zero.gather_16bit_weights_on_model_save is True
        assert zero.reduce_bucket_size == 2048 * 2048  # HF's "auto": hidden_size²
    if offload_optimizer:
        # the HF Trainer passes torch's AdamW; DeepSpeed refuses it with offload unless this is off
        assert parsed.zero_force_ds_cpu_optimizer is False


@pytest.mark.parametrize("name", sorted(DEEPSPEED_PRESETS))
def test_deepspeed_preset_precision_follows_the_yaml_but_never_fp16(name):
    """bf16 is "auto": fp32 when the YAML says bf16: false (CPU, debugging), never fp16 (docs/deepspeed.md)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    path = os.path.join(REPO, "deepspeed_configs", name)
    parsed = DeepSpeedConfig(_filled(path, _training_args(bf16=False)))
    assert not parsed.bfloat16_config.enabled and not parsed.float16_config.enabled
    with pytest.raises(ValueError, match="fp16.enabled=False vs hf fp16"):
        _filled(path, _training_args(bf16=False, fp16=True, use_cpu=False))


def _fsdp_plugin(path):
    """What ``accelerate launch --config_file PATH`` builds: its parser, its env, its plugin."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", path, "-m", "llamafactory.launcher", "train.yaml"])
    args, _, _ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)
    with mock.patch.dict(os.environ, env):
        return env, FullyShardedDataParallelPlugin()


@pytest.mark.parametrize("name", sorted(FSDP_PRESETS))
def test_fsdp2_preset_parses_with_accelerate(name):
    from torch.distributed.fsdp import CPUOffloadPolicy, StateDictType

    env, plugin = _fsdp_plugin(os.path.join(REPO, "examples", "accelerate", name))
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert plugin.fsdp_version == 2
    assert plugin.transformer_cls_names_to_wrap == ["ZebraDecoderLayer"]
    assert plugin.reshard_after_forward is True
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy) == FSDP_PRESETS[name]
    assert plugin.state_dict_type == StateDictType.FULL_STATE_DICT
    assert plugin.activation_checkpointing is False


def test_fsdp_wrap_class_is_every_zebra_decoder_layer():
    from accelerate.utils.dataclasses import get_module_class_from_name

    from llamafactory_zebra.modeling_zebra import ZebraForCausalLM

    _, plugin = _fsdp_plugin(os.path.join(REPO, "examples", "accelerate", "fsdp2_zebra_bf16.yaml"))
    model = ZebraForCausalLM(ZebraConfig.from_preset("tiny"))
    (name,) = plugin.transformer_cls_names_to_wrap
    layer_class = get_module_class_from_name(model, name)
    assert layer_class is not None
    assert all(isinstance(layer, layer_class) for layer in model.model.layers)
    assert name in model._no_split_modules


def _env_file(name):
    values = {}
    with open(os.path.join(REPO, "llamafactory_zebra", "environment", "rocm", name)) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                key, value = line.split("=", 1)
                values[key] = value
    return values


@pytest.mark.parametrize("name,arch", [("mi300x.env", "gfx942"), ("mi250.env", "gfx90a")])
def test_rocm_env_file_is_doctors_table_and_documented(name, arch):
    from llamafactory_zebra.environment.rocm_settings import rocm_env_file, rocm_settings

    assert _env_file(name) == rocm_settings(arch)
    assert rocm_env_file(arch).name == name
    with open(os.path.join(REPO, "docs", "rocm.md")) as f:
        documented = {m.group(1) for m in re.finditer(r"^\| `([A-Z0-9_]+)` \|", f.read(), re.MULTILINE)}
    assert set(rocm_settings(arch)) <= documented


def _run_launcher(tmp_path, script, env_overrides, args=("train.yaml", "mi300x")):
    """Run a launch script with a stand-in ``llamafactory-cli`` that records its arguments and environment."""
    fake = tmp_path / "bin" / "llamafactory-cli"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/usr/bin/env bash\necho "ARGS $*"\nenv\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PATH=f"{fake.parent}:{env['PATH']}", **env_overrides)
    result = subprocess.run(
        ["bash", os.path.join(REPO, "examples", "rocm", script), *args], capture_output=True, text=True, env=env
    )
    seen = dict(
        line.split("=", 1) for line in result.stdout.splitlines() if "=" in line and not line.startswith("ARGS")
    )
    return result, seen


@pytest.mark.slow
def test_single_node_script_sets_what_llamafactory_launcher_reads(tmp_path):
    result, seen = _run_launcher(tmp_path, "train_single_node.sh", {})
    assert result.returncode == 0, result.stderr
    assert "ARGS train train.yaml" in result.stdout
    assert seen["FORCE_TORCHRUN"] == "1" and seen["NPROC_PER_NODE"] == "8"
    assert {k: seen[k] for k in _env_file("mi300x.env")} == _env_file("mi300x.env")


@pytest.mark.slow
def test_multi_node_script_requires_and_exports_the_rendezvous(tmp_path):
    rendezvous = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    result, seen = _run_launcher(tmp_path, "train_multi_node.sh", rendezvous, ("train.yaml", "mi250"))
    assert result.returncode == 0, result.stderr
    assert {k: seen[k] for k in rendezvous} == rendezvous and seen["FORCE_TORCHRUN"] == "1"
    assert seen["PYTORCH_ROCM_ARCH"] == "gfx90a"
    without_port = {k: v for k, v in rendezvous.items() if k != "MASTER_PORT"}
    result, _ = _run_launcher(tmp_path, "train_multi_node.sh", without_port)
    assert result.returncode != 0 and "MASTER_PORT" in result.stderr

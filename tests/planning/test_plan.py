"""The memory planner: exact parameter inventory, model states against DeepSpeed, activations against
measured CPU memory of the tiny model, and the ``plan`` command end to end."""

import argparse
import concurrent.futures
import dataclasses
import json
import math
import multiprocessing
import os

import pytest
import torch
from repo_paths import REPO

from llamafactory_zebra.configuration_zebra import ZebraConfig
from llamafactory_zebra.planning.activations import Kernels, activation_estimate, inference_cache_bytes
from llamafactory_zebra.planning.hardware import GIB
from llamafactory_zebra.planning.memory_plan import TrainingSetup, cheapest_fix, make_plan
from llamafactory_zebra.planning.model_states import Sharding, model_state_bytes
from llamafactory_zebra.planning.parameters import (
    freeze_trainable_params,
    lora_trainable_params,
    summarize,
    zebra_modules,
)

ONE_M = "qwen3-1.7b-7mla21gdn-1m"


def test_parameter_counts_match_the_published_ones():
    assert summarize(ZebraConfig.from_preset(ONE_M)).total == 2_284_173_820
    assert summarize(ZebraConfig.from_preset("qwen3-1.7b-14mla14gdn")).total == 2_182_902_440


def _direct_params(model: torch.nn.Module) -> dict[str, int]:
    counts = {name: sum(p.numel() for p in m.parameters(recurse=False)) for name, m in model.named_modules()}
    return {name: n for name, n in counts.items() if n}


@pytest.mark.parametrize("preset", ["tiny", ONE_M])
def test_module_inventory_is_the_models(preset):
    from llamafactory_zebra.modeling_zebra import ZebraForCausalLM

    config = ZebraConfig.from_preset(preset)
    with torch.device("meta"):
        model = ZebraForCausalLM(config)
    assert {m.name: m.params for m in zebra_modules(config)} == _direct_params(model)
    linears = {
        name: (m.in_features, m.out_features) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
    }
    assert {m.name: m.linear for m in zebra_modules(config) if m.linear} == linears


def test_lora_count_equals_peft():
    from peft import LoraConfig, get_peft_model

    from llamafactory_zebra.modeling_zebra import ZebraForCausalLM

    config = ZebraConfig.from_preset("tiny")
    linear_names = sorted({m.name.rsplit(".", 1)[-1] for m in zebra_modules(config) if m.linear} - {"lm_head"})
    model = get_peft_model(ZebraForCausalLM(config), LoraConfig(r=4, target_modules=linear_names))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert lora_trainable_params(config, 4, ["all"]) == trainable
    model = get_peft_model(ZebraForCausalLM(config), LoraConfig(r=4, target_modules=["q_proj", "down_proj"]))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert lora_trainable_params(config, 4, ["q_proj", "down_proj"]) == trainable


@pytest.mark.parametrize(
    "layers,modules,extra", [(2, ["all"], None), (-1, ["mlp"], ["embed_tokens"]), (1, ["gdn"], None)]
)
def test_freeze_count_equals_llamafactory(layers, modules, extra):
    from llamafactory.hparams import FinetuningArguments
    from llamafactory.model.adapter import _setup_freeze_tuning
    from transformers import HfArgumentParser

    from llamafactory_zebra.modeling_zebra import ZebraForCausalLM

    config = ZebraConfig.from_preset("tiny")
    model = ZebraForCausalLM(config)
    (args,) = HfArgumentParser([FinetuningArguments]).parse_dict(
        {
            "finetuning_type": "freeze",
            "freeze_trainable_layers": layers,
            "freeze_trainable_modules": ",".join(modules),
            **({"freeze_extra_modules": ",".join(extra)} if extra else {}),
        }
    )
    _setup_freeze_tuning(model, args, is_trainable=True, cast_trainable_params_to_fp32=False)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert freeze_trainable_params(config, layers, modules, extra) == trainable


def _states(stage, gpus, offload_optimizer=False, offload_params=False):
    summary = summarize(ZebraConfig.from_preset(ONE_M))
    sharding = Sharding(stage, gpus, offload_optimizer, offload_params)
    return summary, model_state_bytes(summary.total, summary.total, summary.largest_module, sharding, "bf16")


@pytest.mark.parametrize("offload", [False, True])
def test_zero2_matches_deepspeed_estimator(offload):
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    summary, states = _states(2, 8, offload_optimizer=offload)
    _, ds_gpu = estimate_zero2_model_states_mem_needs(summary.total, num_gpus_per_node=8, cpu_offload=offload)
    assert states.during_step == pytest.approx(ds_gpu, rel=0.05)


@pytest.mark.parametrize("offload_params", [False, True])
def test_zero3_offload_matches_deepspeed_estimator(offload_params):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    summary, states = _states(3, 8, offload_optimizer=True, offload_params=offload_params)
    _, ds_gpu, _ = estimate_zero3_model_states_mem_needs(
        summary.total, summary.largest_module, num_gpus_per_node=8, cpu_offload=True, cpu_offload_params=offload_params
    )
    assert states.during_backward == pytest.approx(ds_gpu, rel=0.05)


def test_zero3_deepspeed_estimate_lies_between_our_two_phases():
    """DeepSpeed's estimator charges 18 B/parameter for ZeRO-3 without offload; the buffers it allocates
    are 16 B during forward/backward and 20 B during the step (measured below). Its number sits between."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    summary, states = _states(3, 8)
    _, ds_gpu, _ = estimate_zero3_model_states_mem_needs(
        summary.total, summary.largest_module, num_gpus_per_node=8, cpu_offload=False, cpu_offload_params=False
    )
    during_step_with_gather = states.during_step + states.gathered
    assert states.during_backward < ds_gpu < during_step_with_gather
    assert ds_gpu == pytest.approx(states.during_backward, rel=0.10)


def _deepspeed_buffers(stage: int) -> tuple[int, dict[str, int]]:
    """Runs in a fresh process: a one-rank CPU DeepSpeed engine with our preset, after one step."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + stage), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1"
    )
    torch.set_num_threads(1)
    import importlib

    import deepspeed

    from llamafactory_zebra.planning.measure import deepspeed_state_bytes

    # A C++ build for CPU collectives (about a minute when not cached), irrelevant to memory. The module is
    # fetched from sys.modules: ``deepspeed.comm.torch`` as an attribute is the torch package.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    preset = "ds_z3_bf16.json" if stage == 3 else "ds_z2_bf16.json"
    with open(os.path.join(REPO, "deepspeed_configs", preset)) as f:
        config = json.load(f)
    config.update(
        train_micro_batch_size_per_gpu=2,
        gradient_accumulation_steps=1,
        train_batch_size=2,
        gradient_clipping=1.0,
        bf16={"enabled": True},  # HF's "auto" for a YAML with bf16: true
    )
    zero = config["zero_optimization"]
    zero.update({k: 4096 for k, v in zero.items() if v == "auto"})
    zero["stage3_param_persistence_threshold"] = 0
    model = torch.nn.Sequential(torch.nn.Embedding(512, 64), torch.nn.Linear(64, 256), torch.nn.Linear(256, 512))
    params = sum(p.numel() for p in model.parameters())  # before ZeRO-3 replaces them by placeholders
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    loss = engine(torch.randint(0, 512, (2, 8))).float().pow(2).mean()
    engine.backward(loss)
    engine.step()
    return params, deepspeed_state_bytes(engine)


@pytest.mark.slow  # a forked DeepSpeed process
def test_model_state_buffers_equal_what_deepspeed_allocates():
    # A child process keeps torch.distributed out of the test process; fork reuses the imports already made.
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        results = {stage: pool.submit(_deepspeed_buffers, stage).result(timeout=300) for stage in (3, 2)}
    for stage, (params, measured) in results.items():
        states = model_state_bytes(params, params, 0, Sharding(stage, 1), "bf16")
        assert measured["parameters"] == states.parameters
        assert measured["optimizer"] == states.optimizer
        # ZeRO-3 keeps its gradient partitions between steps; ZeRO-2 frees them after the step.
        assert measured["gradients"] == (states.gradients if stage == 3 else 0)


def _tiny_bf16_model(gradient_checkpointing: bool, fused: bool):
    from llamafactory_zebra.modeling_zebra import ZebraForCausalLM

    config = ZebraConfig.from_preset("tiny")
    config._attn_implementation = "sdpa"
    model = ZebraForCausalLM(config).to(torch.bfloat16).train()
    if fused:
        model.enable_fused_cross_entropy("chunked")
    if gradient_checkpointing:
        # As LLaMA-Factory enables it (model/model_utils/checkpointing.py): reentrant, inputs require grad.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model.enable_input_require_grads()
    return config, model


@pytest.mark.parametrize("gradient_checkpointing,fused", [(False, False), (True, True)])
def test_activation_formula_matches_measured_cpu_memory(gradient_checkpointing, fused):
    from llamafactory_zebra.planning.measure import measure_step

    torch.set_num_threads(1)
    config, model = _tiny_bf16_model(gradient_checkpointing, fused)
    kernels = Kernels(attention="sdpa", gdn="torch", loss="chunked" if fused else "logits")
    parameter_grads = sum(p.numel() * p.element_size() for p in model.parameters())
    for length in (512, 1024, 2048):
        ids = torch.randint(0, config.vocab_size, (1, length))
        measured = measure_step(model, {"input_ids": ids, "labels": ids})
        estimate = activation_estimate(config, length, 2, kernels, gradient_checkpointing)
        assert estimate.layers_saved + estimate.model_saved == pytest.approx(measured.saved, rel=0.10), length
        assert estimate.peak + parameter_grads == pytest.approx(measured.peak, rel=0.25), length


def test_gradient_checkpointing_and_sequence_parallel_shrink_activations():
    config = ZebraConfig.from_preset(ONE_M)
    gpu = Kernels()
    full = activation_estimate(config, 65536, 2, gpu, gradient_checkpointing=False)
    checkpointed = activation_estimate(config, 65536, 2, gpu, gradient_checkpointing=True)
    half = activation_estimate(config, 32768, 2, gpu, gradient_checkpointing=True)
    assert checkpointed.peak < full.peak / 4
    assert half.peak == pytest.approx(checkpointed.peak / 2, rel=0.02)
    assert full.components["gdn layers"] > full.components["mla layers"]


def test_inference_cache_is_the_latent_and_a_fixed_gdn_state():
    config = ZebraConfig.from_preset(ONE_M)
    short, long = inference_cache_bytes(config, 1000), inference_cache_bytes(config, 2000)
    # Per MLA layer and token: the 256-value latent, the 64-dim rope key and one 1/rms per key head (8, qk_head norm).
    assert long["mla latent cache"] == 2 * short["mla latent cache"] == 2 * 7 * (256 + 64 + 8) * 2 * 1000
    assert long["gdn state"] == short["gdn state"] > 0


def _setup(**changes) -> TrainingSetup:
    values = dict(
        config=ZebraConfig.from_preset(ONE_M),
        model_label=ONE_M,
        cutoff_len=131072,
        micro_batch=1,
        gpus=8,
        gpu_memory=192 * GIB,
        gpu_label="mi300x",
        attention="flash_attention_2",
        fused_cross_entropy=True,
        zero_stage=3,
    )
    values.update(changes)
    return TrainingSetup(**values)


def test_cheapest_fix_is_the_first_single_change_that_fits():
    setup = _setup(fused_cross_entropy=False)
    assert not make_plan(setup).fits
    changes, fixed = cheapest_fix(setup)
    assert changes == ["enable_liger_kernel: true (fused linear cross-entropy)"]
    assert fixed.fits and make_plan(dataclasses.replace(setup, fused_cross_entropy=True)).fits


def test_sequence_parallel_is_proposed_when_only_splitting_fits():
    setup = _setup(cutoff_len=1048576, micro_batch=1)
    assert not make_plan(setup).fits
    changes, fixed = cheapest_fix(setup)
    assert len(changes) == 1 and changes[0].startswith("sequence_parallel_size: ")
    assert fixed.fits and fixed.setup.tokens_per_gpu < setup.tokens_per_gpu


def _write_yaml(tmp_path, **values):
    base = {
        "model_name_or_path": "amd/zebra_qwen3_7MLA21GDN_noT_SFT_1M_combined_fCE",
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "dataset": "identity",
        "template": "qwen3",
        "cutoff_len": 1048576,
        "packing": True,
        "flash_attn": "fa2",
        "enable_liger_kernel": True,
        "per_device_train_batch_size": 2,
        "bf16": True,
        "deepspeed": os.path.join(REPO, "deepspeed_configs", "ds_z3_bf16.json"),
        "output_dir": str(tmp_path / "out"),
        "sequence_parallel_size": 8,
    }
    base.update(values)
    path = tmp_path / "train.yaml"
    path.write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in base.items() if v is not None))
    return str(path)


def _run_plan(capsys, *argv):
    from llamafactory_zebra.cli import plan_cmd

    parser = argparse.ArgumentParser()
    plan_cmd.add_parser(parser.add_subparsers())
    args = parser.parse_args(["plan", *argv])
    code = args.func(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_plan_command_on_the_1m_recipe(tmp_path, capsys):
    code, out, _ = _run_plan(capsys, _write_yaml(tmp_path), "--json")
    report = json.loads(out)
    assert code == 0 and report["verdict"]["fits"]
    assert report["model"]["parameters"] == 2_284_173_820
    assert report["run"]["tokens_per_gpu"] == 2 * math.ceil(1048575 / 8)  # LLaMA-Factory packs cutoff_len - 1
    assert report["run"]["zero_stage"] == 3 and report["model_states"]["zero3_gathered_module"] > 0
    assert report["logits"]["unfused_peak"] > 50 * report["logits"]["fused_peak"]
    lengths = [row["sequence_length"] for row in report["activations"]["by_length"]]
    assert lengths == sorted(lengths) and lengths[-1] == 1048575

    code, out, _ = _run_plan(
        capsys, _write_yaml(tmp_path, sequence_parallel_size=None, deepspeed=None), "--gpu-type", "h100"
    )
    assert code == 1 and "DOES NOT FIT" in out and "cheapest change" in out


def test_plan_reads_local_checkpoints_in_both_layouts(tmp_path, capsys):
    native = tmp_path / "native"
    ZebraConfig.from_preset("qwen3-1.7b-14mla14gdn").save_pretrained(native)
    released = tmp_path / "released"
    released.mkdir()
    (released / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3",
                "num_hidden_layers": 28,
                "vocab_size": 151936,
                "hidden_size": 2048,
                "intermediate_size": 6144,
            }
        )
    )
    (released / "hybrid_config.json").write_text(
        json.dumps({"mla_layers": [1, 5, 9, 13, 17, 21, 25], "linear_type": "gdn"})
    )
    for path, total in ((native, 2_182_902_440), (released, 2_284_173_820)):
        code, out, _ = _run_plan(capsys, _write_yaml(tmp_path, model_name_or_path=str(path)), "--json")
        assert json.loads(out)["model"]["parameters"] == total


def test_plan_names_the_bad_field(tmp_path, capsys):
    code, _, err = _run_plan(capsys, _write_yaml(tmp_path, model_name_or_path="meta-llama/Llama-3-8B"))
    assert code == 2 and "model_name_or_path" in err and "qwen3-1.7b-7mla21gdn-1m" in err
    code, _, err = _run_plan(capsys, _write_yaml(tmp_path, deepspeed="missing.json"))
    assert code == 2 and "missing.json" in err


@pytest.mark.parametrize(
    ("flash_attn", "message"),
    [
        ("fa3", 'flash_attn: fa3 is not supported for Zebra: LLaMA-Factory 0.9.5 raises "Unknown attention type"'),
        ("disabled", "flash_attn disabled (eager attention) keeps a T×T score matrix per head"),
    ],
)
def test_plan_refuses_the_attention_it_cannot_model(tmp_path, capsys, flash_attn, message):
    """The values come from ``attention_policy.py``'s one table: fa3 refused, eager not modelled."""
    code, out, err = _run_plan(capsys, _write_yaml(tmp_path, flash_attn=flash_attn))
    assert code != 0 and message in out + err

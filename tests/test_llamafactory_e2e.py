"""LLaMA-Factory's own commands (`llamafactory-cli train/export/api`, `ChatModel`) on the tiny Zebra, on CPU.

Each run goes through the real CLI in a fresh process, so the import hook — not this test process —
must activate the plugin there (and in both torchrun workers for the ZeRO-3 run).
"""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

BASE_ARGS = {
    "stage": "sft",
    "do_train": True,
    "dataset": "zebra_demo",
    "dataset_dir": str(REPO / "examples" / "data"),
    "template": "zebra",
    "cutoff_len": 128,
    "max_samples": 32,
    "packing": True,
    "neat_packing": True,
    "overwrite_cache": True,
    "preprocessing_num_workers": 1,
    "dataloader_num_workers": 0,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 1,
    "learning_rate": 5.0e-3,
    "lr_scheduler_type": "constant",
    "max_steps": 6,
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "bf16": False,
    "seed": 7,
    "enable_liger_kernel": True,
    "overwrite_output_dir": True,
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from llamafactory_zebra.cli.init_cmd import write_random_model

    return write_random_model("tiny", tmp_path_factory.mktemp("zebra") / "tiny", seed=3)


def run_cli(command, args, tmp_path, env=None, timeout=600):
    config = tmp_path / f"{command}-{len(list(tmp_path.glob('*.yaml')))}.yaml"
    config.write_text(yaml.safe_dump(args))
    result = subprocess.run(
        ["llamafactory-cli", command, str(config)],
        cwd=tmp_path,
        env={**os.environ, "DISABLE_VERSION_CHECK": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result.stdout + result.stderr


def logged_losses(output_dir):
    lines = (Path(output_dir) / "trainer_log.jsonl").read_text().splitlines()
    return {entry["current_steps"]: entry["loss"] for entry in map(json.loads, lines) if "loss" in entry}


def assert_loss_falls(losses):
    steps = sorted(losses)
    assert len(steps) >= 5
    assert losses[steps[-1]] < losses[steps[0]] - 0.2, losses


def test_full_sft_then_resume_from_a_checkpoint_reaches_the_same_end(tiny_dir, tmp_path):
    args = {**BASE_ARGS, "model_name_or_path": str(tiny_dir), "finetuning_type": "full", "plot_loss": True}
    out = tmp_path / "full"
    log = run_cli("train", {**args, "output_dir": str(out), "save_strategy": "steps", "save_steps": 3}, tmp_path)
    assert "llamafactory-zebra 0.1.0 active" in log
    assert "fused linear cross-entropy on (chunked)" in log
    losses = logged_losses(out)
    assert_loss_falls(losses)
    assert (out / "training_loss.png").stat().st_size > 0

    # What an interrupted run leaves behind: only the step-3 checkpoint.
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(out / "checkpoint-3", resumed / "checkpoint-3")
    run_cli(
        "train",
        {
            **args,
            "output_dir": str(resumed),
            "overwrite_output_dir": False,
            "resume_from_checkpoint": str(resumed / "checkpoint-3"),
        },
        tmp_path,
    )
    resumed_losses = logged_losses(resumed)
    assert max(resumed_losses) == 6
    for step in (4, 5, 6):
        assert resumed_losses[step] == pytest.approx(losses[step], abs=1e-4)
    final, again = load_file(out / "model.safetensors"), load_file(resumed / "model.safetensors")
    for name, tensor in final.items():
        torch.testing.assert_close(again[name], tensor, rtol=1e-4, atol=1e-5)


def test_lora_all_targets_both_mixers_and_exports_a_standalone_merge(tiny_dir, tmp_path):
    adapter = tmp_path / "lora"
    lora = {"finetuning_type": "lora", "lora_target": "all", "lora_rank": 4, "learning_rate": 2.0e-2}
    run_cli("train", {**BASE_ARGS, **lora, "model_name_or_path": str(tiny_dir), "output_dir": str(adapter)}, tmp_path)
    assert_loss_falls(logged_losses(adapter))
    targets = set(json.loads((adapter / "adapter_config.json").read_text())["target_modules"])
    assert {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "out_proj"} <= targets
    assert {"q_proj", "k_proj", "v_proj", "g_proj", "o_proj"} <= targets
    assert "lm_head" not in targets

    merged = tmp_path / "merged"
    export = {
        "model_name_or_path": str(tiny_dir),
        "adapter_name_or_path": str(adapter),
        "template": "zebra",
        "finetuning_type": "lora",
        "export_dir": str(merged),
        "export_device": "cpu",
    }
    run_cli("export", export, tmp_path)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    standalone = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    assert type(standalone).__name__ == "ZebraForCausalLM"
    assert not any("lora" in name for name in standalone.state_dict())
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(base, adapter).eval()
    tokens = torch.randint(0, standalone.config.vocab_size, (1, 24))
    with torch.no_grad():
        torch.testing.assert_close(standalone(tokens).logits, with_adapter(tokens).logits, rtol=1e-4, atol=1e-5)


def test_freeze_tuning_trains_only_the_last_layers(tiny_dir, tmp_path):
    out = tmp_path / "freeze"
    freeze = {"finetuning_type": "freeze", "freeze_trainable_layers": 2, "freeze_trainable_modules": "all"}
    run_cli("train", {**BASE_ARGS, **freeze, "model_name_or_path": str(tiny_dir), "output_dir": str(out)}, tmp_path)
    assert_loss_falls(logged_losses(out))
    before, after = load_file(tiny_dir / "model.safetensors"), load_file(out / "model.safetensors")
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and all(name.startswith(("model.layers.2.", "model.layers.3.")) for name in changed)
    assert any(".mla." in name or ".gdn." in name for name in changed)


def _preset_args(tiny_dir, out, preset, **overrides):
    return {
        **BASE_ARGS,
        "model_name_or_path": str(tiny_dir),
        "finetuning_type": "full",
        "output_dir": str(out),
        "deepspeed": str(REPO / "deepspeed_configs" / f"{preset}.json"),  # as shipped: bf16 "auto" -> fp32 here
        "per_device_train_batch_size": 1,
        "max_steps": 5,
        "ddp_timeout": 600,
        "tiled_mlp": preset == "ds_z3_bf16",
        **overrides,
    }


def _two_ranks():
    return {"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2", "MASTER_PORT": str(_free_port())}


@pytest.fixture(scope="module")
def zero3_run(tiny_dir, tmp_path_factory):
    """One uninterrupted 2-rank ZeRO-3 run, saving every 2 steps: the preset check and the resume reference."""
    tmp_path = tmp_path_factory.mktemp("zero3")
    args = _preset_args(
        tiny_dir, tmp_path / "ds_z3_bf16", "ds_z3_bf16", max_steps=6, save_strategy="steps", save_steps=2
    )
    return args, run_cli("train", args, tmp_path, env=_two_ranks())


@pytest.mark.parametrize(
    "preset", ["ds_z3_bf16", "ds_z3_bf16_offload_optimizer", "ds_z3_bf16_offload_all", "ds_z2_bf16"]
)
def test_two_processes_with_each_deepspeed_preset_save_every_weight(tiny_dir, tmp_path, preset, request):
    """The "empty ZeRO-3 save" trap: the saved model must hold every weight, trained, and reload strictly.
    The preset is used unmodified with the YAML's ``bf16: false`` (CPU): its bf16 "auto" follows the YAML."""
    if preset == "ds_z3_bf16":
        args, log = request.getfixturevalue("zero3_run")
    else:
        args = _preset_args(tiny_dir, tmp_path / preset, preset)
        log = run_cli("train", args, tmp_path, env=_two_ranks())
    out = Path(args["output_dir"])
    assert ("MLPs run over sequence tiles" in log) == args["tiled_mlp"]
    for rank in (0, 1):
        assert f"llamafactory-zebra 0.1.0 active in rank {rank}" in log
    assert len(logged_losses(out)) == args["max_steps"]
    initial, saved = load_file(tiny_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert saved.keys() == initial.keys()
    for name, tensor in initial.items():
        assert saved[name].shape == tensor.shape and torch.isfinite(saved[name]).all(), name
    assert sum(not torch.equal(saved[n], initial[n]) for n in initial) > len(initial) // 2
    from llamafactory_zebra import ZebraForCausalLM

    ZebraForCausalLM.from_pretrained(out)  # strict: raises on any missing or unexpected weight


def _train_until_then_kill_rank_1(args, tmp_path, saved):
    """Start a 2-rank run and ``kill -9`` its rank-1 worker as soon as ``saved`` exists."""
    import psutil

    config = tmp_path / "killed.yaml"
    config.write_text(yaml.safe_dump(args))
    env = {**os.environ, "DISABLE_VERSION_CHECK": "1", **_two_ranks()}
    output = tmp_path / "killed.log"  # a file, not a pipe: an unread pipe fills up and stalls the workers
    with output.open("w") as sink:
        launcher = subprocess.Popen(
            ["llamafactory-cli", "train", str(config)], cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.time() + 600
            while not saved.exists():
                assert launcher.poll() is None and time.time() < deadline, output.read_text()[-3000:]
                time.sleep(0.1)
            workers = [
                p
                for p in psutil.Process(launcher.pid).children(recursive=True)
                if "launcher.py" in " ".join(p.cmdline())
            ]
            (rank_1,) = [p for p in workers if p.environ().get("LOCAL_RANK") == "1"]
            rank_1.kill()  # SIGKILL, as the OOM killer or a lost node would
            launcher.wait(timeout=300)
        finally:
            if launcher.poll() is None:
                for process in [*psutil.Process(launcher.pid).children(recursive=True), psutil.Process(launcher.pid)]:
                    process.kill()
    assert launcher.returncode != 0


def test_zero3_run_killed_between_saves_resumes_with_the_uninterrupted_losses(zero3_run, tmp_path):
    """``kill -9`` of one rank after checkpoint-2; checkpoint-4, cut short, lacks its trainer state and rank 1's
    RNG file. Re-running the same YAML (LLaMA-Factory resumes an existing output_dir) must skip that partial
    save, resume from checkpoint-2 and log the uninterrupted run's losses, step for step (fp32 on CPU:
    |difference| <= 1e-5)."""
    reference_args, _ = zero3_run
    out = tmp_path / "killed"
    args = {**reference_args, "output_dir": str(out)}
    _train_until_then_kill_rank_1(args, tmp_path, out / "checkpoint-2" / "trainer_state.json")
    partial = out / "checkpoint-4"
    if not partial.exists():  # the kill came before the next save started: leave what a kill during it leaves
        shutil.copytree(out / "checkpoint-2", partial)
        (partial / "rng_state_1.pth").unlink()
    (partial / "trainer_state.json").unlink(missing_ok=True)
    assert not (out / "checkpoint-6").exists()

    log = run_cli("train", {**args, "overwrite_output_dir": False}, tmp_path, env=_two_ranks())
    assert f"resuming from {out / 'checkpoint-2'}, the last complete checkpoint" in log
    resumed, reference = logged_losses(out), logged_losses(reference_args["output_dir"])
    assert sorted(resumed) == sorted(reference) == list(range(1, 7))
    for step in range(3, 7):
        assert resumed[step] == pytest.approx(reference[step], abs=1e-5), (step, resumed, reference)
    assert (out / "checkpoint-6" / "trainer_state.json").exists()


def test_chat_model_answers_one_turn_with_the_hybrid_cache(tiny_dir):
    from llamafactory.chat import ChatModel

    chat = ChatModel(
        {"model_name_or_path": str(tiny_dir), "template": "zebra", "infer_backend": "huggingface", "max_new_tokens": 8}
    )
    responses = chat.chat([{"role": "user", "content": "What is 2 + 2?"}])
    assert len(responses) == 1 and responses[0].response_length >= 1
    assert type(chat.engine.model).__name__ == "ZebraForCausalLM"


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_openai_api_server_generates(tiny_dir, tmp_path):
    port = _free_port()
    config = tmp_path / "api.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model_name_or_path": str(tiny_dir),
                "template": "zebra",
                "infer_backend": "huggingface",
                "max_new_tokens": 8,
            }
        )
    )
    env = {**os.environ, "API_PORT": str(port), "API_HOST": "127.0.0.1", "DISABLE_VERSION_CHECK": "1"}
    server = subprocess.Popen(
        ["llamafactory-cli", "api", str(config)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        body = json.dumps(
            {"model": "zebra", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
        ).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        deadline = time.time() + 180
        while True:
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    answer = json.loads(response.read())
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise
                time.sleep(1)
        assert answer["choices"][0]["message"]["role"] == "assistant"
        assert answer["usage"]["completion_tokens"] >= 1
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_disabled_plugin_leaves_zebra_unknown_to_stock_llamafactory(tiny_dir, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                **BASE_ARGS,
                "model_name_or_path": str(tiny_dir),
                "finetuning_type": "full",
                "output_dir": str(tmp_path / "o"),
                "dataset": "zebra_demo",
                # Stock's own template (zebra's would be the first unknown name): the model type is what fails.
                "template": "qwen3",
            }
        )
    )
    result = subprocess.run(
        ["llamafactory-cli", "train", str(config)],
        env={**os.environ, "LLAMAFACTORY_ZEBRA_DISABLE": "1", "DISABLE_VERSION_CHECK": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "llamafactory-zebra 0.1.0 active" not in result.stdout + result.stderr
    assert "model type `zebra`" in result.stderr or "'zebra'" in result.stderr

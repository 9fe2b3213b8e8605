"""LLaMA-Factory's own commands (`llamafactory-cli train/export/api`, `ChatModel`) on the tiny Zebra, on CPU,
in one process (the multi-process DeepSpeed runs are in ``test_llamafactory_deepspeed.py``).

Each run goes through the real CLI in a fresh process, so the import hook — not this test process —
must activate the plugin there.
"""

import json
import os
import shutil
import subprocess
import time
import urllib.request

import pytest
import torch
import yaml
from llamafactory_cli import BASE_ARGS, assert_loss_falls, free_port, logged_losses, run_cli
from safetensors.torch import load_file

pytestmark = pytest.mark.slow


def test_full_sft_then_resume_from_a_checkpoint_reaches_the_same_end(tiny_model_dir_seed3, tmp_path):
    args = {**BASE_ARGS, "model_name_or_path": str(tiny_model_dir_seed3), "finetuning_type": "full", "plot_loss": True}
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


def test_lora_all_targets_both_mixers_and_exports_a_standalone_merge(tiny_model_dir_seed3, tmp_path):
    adapter = tmp_path / "lora"
    lora = {"finetuning_type": "lora", "lora_target": "all", "lora_rank": 4, "learning_rate": 2.0e-2}
    run_cli(
        "train",
        {**BASE_ARGS, **lora, "model_name_or_path": str(tiny_model_dir_seed3), "output_dir": str(adapter)},
        tmp_path,
    )
    assert_loss_falls(logged_losses(adapter))
    targets = set(json.loads((adapter / "adapter_config.json").read_text())["target_modules"])
    assert {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "out_proj"} <= targets
    assert {"q_proj", "k_proj", "v_proj", "g_proj", "o_proj"} <= targets
    assert "lm_head" not in targets

    merged = tmp_path / "merged"
    export = {
        "model_name_or_path": str(tiny_model_dir_seed3),
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
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir_seed3, dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(base, adapter).eval()
    tokens = torch.randint(0, standalone.config.vocab_size, (1, 24))
    with torch.no_grad():
        torch.testing.assert_close(standalone(tokens).logits, with_adapter(tokens).logits, rtol=1e-4, atol=1e-5)


def test_freeze_tuning_trains_only_the_last_layers(tiny_model_dir_seed3, tmp_path):
    out = tmp_path / "freeze"
    freeze = {"finetuning_type": "freeze", "freeze_trainable_layers": 2, "freeze_trainable_modules": "all"}
    run_cli(
        "train",
        {**BASE_ARGS, **freeze, "model_name_or_path": str(tiny_model_dir_seed3), "output_dir": str(out)},
        tmp_path,
    )
    assert_loss_falls(logged_losses(out))
    before, after = load_file(tiny_model_dir_seed3 / "model.safetensors"), load_file(out / "model.safetensors")
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and all(name.startswith(("model.layers.2.", "model.layers.3.")) for name in changed)
    assert any(".mla." in name or ".gdn." in name for name in changed)


def test_chat_model_answers_one_turn_with_the_hybrid_cache(tiny_model_dir_seed3):
    from llamafactory.chat import ChatModel

    chat = ChatModel(
        {
            "model_name_or_path": str(tiny_model_dir_seed3),
            "template": "zebra",
            "infer_backend": "huggingface",
            "max_new_tokens": 8,
        }
    )
    responses = chat.chat([{"role": "user", "content": "What is 2 + 2?"}])
    assert len(responses) == 1 and responses[0].response_length >= 1
    assert type(chat.engine.model).__name__ == "ZebraForCausalLM"


def test_openai_api_server_generates(tiny_model_dir_seed3, tmp_path):
    port = free_port()
    config = tmp_path / "api.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model_name_or_path": str(tiny_model_dir_seed3),
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


def test_disabled_plugin_leaves_zebra_unknown_to_stock_llamafactory(tiny_model_dir_seed3, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                **BASE_ARGS,
                "model_name_or_path": str(tiny_model_dir_seed3),
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

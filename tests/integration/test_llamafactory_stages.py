"""Every LLaMA-Factory training stage on the tiny Zebra through ``llamafactory-cli train``, on CPU.

Each run is a fresh ``llamafactory-cli`` process (the import hook activates the plugin there) on the README
format fixtures of ``tests/fixtures/llamafactory_readme/`` (the rows ``test_data_stages.py`` shows load as
stock loads them), kept to 3 optimizer steps: each logs a finite loss at every step. Runs are not combined
across stages: each stage has its own trainer, collator and loss in LLaMA-Factory.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from llamafactory_cli import BASE_ARGS, logged_losses, run_cli
from repo_paths import FIXTURES

pytestmark = pytest.mark.slow

README = FIXTURES / "llamafactory_readme"
STEPS = 3
STAGE_ARGS = {
    **BASE_ARGS,
    "dataset_dir": str(README),
    "packing": False,
    "neat_packing": False,
    "max_steps": STEPS,
    "per_device_train_batch_size": 2,
    "learning_rate": 5.0e-3,
}
LORA = {"finetuning_type": "lora", "lora_target": "all", "lora_rank": 4}


def _train(tiny_model_dir_seed3, tmp_path, name, **args):
    out = tmp_path / name
    log = run_cli(
        "train",
        {**STAGE_ARGS, "model_name_or_path": str(tiny_model_dir_seed3), "output_dir": str(out), **args},
        tmp_path,
    )
    assert "llamafactory-zebra 0.1.0 active" in log
    losses = logged_losses(out)
    assert sorted(losses) == list(range(1, STEPS + 1)), losses
    assert all(math.isfinite(loss) for loss in losses.values()), losses
    return out, log


def test_pretraining_on_packed_plain_text(tiny_model_dir_seed3, tmp_path):
    out, log = _train(
        tiny_model_dir_seed3,
        tmp_path,
        "pt",
        stage="pt",
        dataset="alpaca_pt,alpaca_pt_txt",
        packing=True,
        cutoff_len=32,
        finetuning_type="full",
    )
    assert "Running tokenizer on dataset" in log
    assert (out / "model.safetensors").exists()


def _reward_scores(model_dir, adapter_dir=None):
    """Chosen and rejected scores of the README preference pairs from the saved reward model, reloaded the way
    LLaMA-Factory loads one (its value head from ``value_head.safetensors``)."""
    from llamafactory.data import PairwiseDataCollatorWithPadding, get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_model, load_tokenizer

    args = {
        "stage": "rm",
        "do_train": True,
        "model_name_or_path": str(model_dir),
        "dataset": "alpaca_preference",
        "dataset_dir": str(README),
        "template": "zebra",
        "cutoff_len": 128,
        "output_dir": str(Path(model_dir).parent / "scores"),
        "report_to": "none",
        "overwrite_cache": True,
        "finetuning_type": "lora" if adapter_dir else "full",
    }
    if adapter_dir:
        args["adapter_name_or_path"] = str(adapter_dir)
    model_args, data_args, training_args, finetuning_args, _ = get_train_args(args)
    tokenizer_module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
    dataset = get_dataset(template, model_args, data_args, training_args, "rm", **tokenizer_module)["train_dataset"]
    model = load_model(
        tokenizer_module["tokenizer"], model_args, finetuning_args, is_trainable=False, add_valuehead=True
    )
    collator = PairwiseDataCollatorWithPadding(template=template, model=model, **tokenizer_module)
    batch = collator([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        _, _, values = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], return_dict=True)
    last = batch["attention_mask"].sum(-1) - 1  # right padding: the score is the last real token's value
    scores = values.gather(-1, last.unsqueeze(-1)).squeeze(-1)
    chosen, rejected = scores.split(len(dataset))
    return model, chosen, rejected


@pytest.mark.parametrize("method", ["full", "lora"])
def test_reward_model_trains_saves_reloads_and_scores(method, tiny_model_dir_seed3, tmp_path):
    from safetensors.torch import load_file

    extra = LORA if method == "lora" else {"finetuning_type": "full"}
    out, _ = _train(tiny_model_dir_seed3, tmp_path, f"rm-{method}", stage="rm", dataset="alpaca_preference", **extra)
    saved_head = load_file(out / "value_head.safetensors")
    assert set(saved_head) == {"v_head.summary.weight", "v_head.summary.bias"}

    model, chosen, rejected = _reward_scores(
        out if method == "full" else tiny_model_dir_seed3, out if method == "lora" else None
    )
    reloaded_head = {f"v_head.{name}": tensor for name, tensor in model.v_head.state_dict().items()}
    for name, tensor in saved_head.items():
        torch.testing.assert_close(reloaded_head[name].float(), tensor.float())
    assert torch.isfinite(chosen).all() and torch.isfinite(rejected).all()
    assert (chosen > rejected).all(), (chosen, rejected)  # trained on these pairs


def test_dpo_lora(tiny_model_dir_seed3, tmp_path):
    _train(tiny_model_dir_seed3, tmp_path, "dpo", stage="dpo", dataset="sharegpt_preference", pref_beta=0.1, **LORA)


def test_orpo_full(tiny_model_dir_seed3, tmp_path):
    _train(
        tiny_model_dir_seed3,
        tmp_path,
        "orpo",
        stage="dpo",
        pref_loss="orpo",
        dataset="alpaca_preference",
        finetuning_type="full",
    )


def test_simpo_freeze(tiny_model_dir_seed3, tmp_path):
    _train(
        tiny_model_dir_seed3,
        tmp_path,
        "simpo",
        stage="dpo",
        pref_loss="simpo",
        simpo_gamma=0.5,
        dataset="sharegpt_preference",
        finetuning_type="freeze",
        freeze_trainable_layers=1,
    )


def test_kto_lora(tiny_model_dir_seed3, tmp_path):
    _train(
        tiny_model_dir_seed3, tmp_path, "kto", stage="kto", dataset="alpaca_kto,sharegpt_kto", pref_beta=0.1, **LORA
    )


def test_qlora_4bit_sft(tiny_model_dir_seed3, tmp_path):
    pytest.importorskip("bitsandbytes")
    out, log = _train(
        tiny_model_dir_seed3, tmp_path, "qlora", stage="sft", dataset="alpaca_sft", quantization_bit=4, **LORA
    )
    assert "Quantizing model to 4 bit with bitsandbytes." in log
    assert (out / "adapter_model.safetensors").exists()


def test_an_empty_data_file_is_the_last_thing_train_prints(tiny_model_dir_seed3, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "dataset_info.json").write_text(
        json.dumps({"docs": {"file_name": "docs.json", "columns": {"prompt": "text"}}})
    )
    (data / "docs.json").write_text("")
    config = tmp_path / "empty.yaml"
    args = {**STAGE_ARGS, "stage": "pt", "dataset": "docs", "dataset_dir": str(data)}
    config.write_text(
        yaml.safe_dump({**args, "model_name_or_path": str(tiny_model_dir_seed3), "output_dir": str(tmp_path / "o")})
    )
    cli = str(Path(sys.executable).parent / "llamafactory-cli")
    result = subprocess.run([cli, "train", str(config)], capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    assert result.stderr.rstrip().splitlines()[-4:] == [
        "llamafactory_zebra.data.row_policy.EmptyDataError: Dataset 'docs' has no rows to train on:",
        f"  - {data / 'docs.json'}: the file is empty (0 bytes)",
        "Each file needs at least one row; a valid row of this entry looks like:",
        '  {"text": "document"}',
    ]

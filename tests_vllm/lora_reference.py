"""The transformers/PEFT/LLaMA-Factory side of ``test_lora.py``, run by the training venv's Python (the vLLM
venv has no PEFT and a transformers LLaMA-Factory does not accept):

    python tests_vllm/lora_reference.py build DIR      # base model, adapters, llamafactory-cli train + export
    python tests_vllm/lora_reference.py reference DIR  # DIR/requests.json -> DIR/references.pt

``build`` writes DIR/base (a small Zebra with the released head shapes and the tiny tokenizer), PEFT
adapters with random B matrices (so each one changes the output), adapters vLLM cannot serve, and
DIR/adapters/lf-all-r8: an adapter trained by ``llamafactory-cli train`` (``lora_target: all``), merged by
``llamafactory-cli export`` into DIR/merged/lf-all-r8. ``reference`` computes, for every served request,
the fp32 log-probs of the base model with the request's adapter (PEFT), of its merged model, and of the
PEFT model in bf16 (the bf16 noise floor) and of the bare base model.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from llamafactory_zebra.testing.vllm_parity import reference_logprobs, zebra_model

REPO = Path(__file__).resolve().parents[1]
LLAMAFACTORY_ADAPTER = "lf-all-r8"
MLA_AND_MLP = ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "out_proj"]
# The narrower target: attention projections and MLP (no GDN gate/decay projections).
ATTENTION_MLP = [*MLA_AND_MLP, "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def all_linear(model) -> list[str]:
    """LLaMA-Factory's ``lora_target: all``: every ``nn.Linear`` but the head, by last name part."""
    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    return sorted(names - {"lm_head"})


def save_peft_adapter(base, path: Path, seed: int, **lora_config) -> None:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(copy.deepcopy(base), LoraConfig(task_type="CAUSAL_LM", **lora_config))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05)
    model.save_pretrained(path)


def run_cli(command: str, args: dict, workdir: Path) -> None:
    config = workdir / f"{command}.yaml"
    config.write_text(yaml.safe_dump(args))
    cli = Path(sys.executable).with_name("llamafactory-cli")
    result = subprocess.run(
        [str(cli), command, str(config)],
        cwd=workdir,
        env={**os.environ, "DISABLE_VERSION_CHECK": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        raise SystemExit(f"llamafactory-cli {command} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}")


def build(root: Path) -> None:
    from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    base = zebra_model(
        seed=0,
        mla_norm="qk_head",
        rope_interleave=True,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )
    base.save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    adapters = root / "adapters"
    save_peft_adapter(base, adapters / "all-r8", 1, r=8, lora_alpha=16, target_modules=all_linear(base))
    save_peft_adapter(base, adapters / "attn-mlp-r32", 2, r=32, lora_alpha=32, target_modules=ATTENTION_MLP)
    # Adapters vLLM cannot serve.
    save_peft_adapter(base, adapters / "dora", 3, r=8, target_modules=MLA_AND_MLP, use_dora=True)
    save_peft_adapter(base, adapters / "rank-64", 4, r=64, target_modules=MLA_AND_MLP)
    save_peft_adapter(base, adapters / "additional-target", 5, r=8, target_modules=MLA_AND_MLP,
                      modules_to_save=["embed_tokens"])  # fmt: skip
    save_peft_adapter(base, adapters / "head", 6, r=8, target_modules=["lm_head", *MLA_AND_MLP])

    train = {
        "model_name_or_path": str(root / "base"),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "lora",
        "lora_target": "all",
        "lora_rank": 8,
        "dataset": "quickstart_train",
        "dataset_dir": str(REPO / "examples" / "data"),
        "template": "zebra",
        "enable_thinking": False,
        "cutoff_len": 64,
        "max_samples": 16,
        "overwrite_cache": True,
        "preprocessing_num_workers": 1,
        "dataloader_num_workers": 0,
        "output_dir": str(adapters / LLAMAFACTORY_ADAPTER),
        "overwrite_output_dir": True,
        "per_device_train_batch_size": 4,
        "learning_rate": 5.0e-2,
        "lr_scheduler_type": "constant",
        "max_steps": 4,
        "save_strategy": "no",
        "report_to": "none",
        "bf16": False,
        "seed": 7,
    }
    run_cli("train", train, root)
    export = {
        "model_name_or_path": str(root / "base"),
        "adapter_name_or_path": str(adapters / LLAMAFACTORY_ADAPTER),
        "template": "zebra",
        "finetuning_type": "lora",
        "export_dir": str(root / "merged" / LLAMAFACTORY_ADAPTER),
        "export_device": "cpu",
    }
    run_cli("export", export, root)


def reference(root: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    def load(path: Path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    base = load(root / "base")
    models = {None: (base, base)}
    for adapter in sorted((root / "adapters").iterdir()):
        if adapter.name not in ("all-r8", "attn-mlp-r32", LLAMAFACTORY_ADAPTER):
            continue
        with_adapter = PeftModel.from_pretrained(copy.deepcopy(base), adapter).eval()
        if adapter.name == LLAMAFACTORY_ADAPTER:
            merged = load(root / "merged" / adapter.name)  # LLaMA-Factory's export
        else:
            merged = PeftModel.from_pretrained(copy.deepcopy(base), adapter).merge_and_unload().eval()
        models[adapter.name] = (with_adapter, merged)
    results = []
    for request in json.loads((root / "requests.json").read_text()):
        with_adapter, merged = models[request["adapter"]]
        tokens = request["tokens"]
        results.append(
            {
                "fp32": reference_logprobs(with_adapter, tokens, torch.float32),
                "merged": reference_logprobs(merged, tokens, torch.float32),
                "bf16": reference_logprobs(with_adapter, tokens, torch.bfloat16),
                "base": reference_logprobs(base, tokens, torch.float32),
            }
        )
    torch.save(results, root / "references.pt")


if __name__ == "__main__":
    {"build": build, "reference": reference}[sys.argv[1]](Path(sys.argv[2]))

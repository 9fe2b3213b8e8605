"""Offline stand-ins for LLaMA-Factory's own test suite, to run it with a tiny dense Llama or a tiny Zebra.

LLaMA-Factory's tests (tag v0.9.5) read their models from the hub (``TINY_LLAMA3``, ``TINY_LLAMA_ADAPTER``,
``TINY_LLAMA_VALUEHEAD``) and their data from the hub (``llamafactory/tiny-supervised-dataset`` with
``dataset_dir: ONLINE``, ``DEMO_DATA`` with ``dataset_dir: REMOTE:llamafactory/demo_data``). This writes, under
``OUT``, what those names resolve to offline:

- ``model/``: a random model saved in fp16 (as the hub's tiny models are), with the project's tiny
  tokenizer carrying Llama-3's special tokens and chat template (the tests use LLaMA-Factory's ``llama3``
  template and compare with ``apply_chat_template``), and the value head LLaMA-Factory's reward stage saves
  beside the weights (``value_head.safetensors``); ``--model llama`` is a 2-layer Llama of width 16 (the
  sizes the tests hard-code), ``--model zebra`` the ``tiny`` Zebra preset (4 layers, width 64);
- ``adapter/``: a LoRA adapter of it (rank 8, every linear but the head, B not zero);
- ``valuehead/``: trl's value-head checkpoint of it (``v_head.summary.*`` inside ``model.safetensors``);
- ``cwd/llamafactory/tiny-supervised-dataset/`` and ``cwd/llamafactory/demo_data/``: local datasets that
  ``datasets.load_dataset`` finds by those hub ids when the tests run from ``cwd/``, built from
  LLaMA-Factory's own ``data/`` demo files (``--lf-data``), plus the demo repository's ``dataset_info.json``
  in an offline hub cache (``hub/``) for ``hf_hub_download``.

It prints the environment to run the suite with (docs/llamafactory.md, "Running LLaMA-Factory's own tests").
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

# Meta-Llama-3-Instruct's chat template: what LLaMA-Factory's ``llama3`` template renders.
LLAMA3_CHAT_TEMPLATE = (
    "{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"]
DEMO_REPO = "llamafactory/demo_data"
DEMO_REVISION = "0" * 40
SYSTEM = "You are a helpful assistant."


def llama3_tokenizer():
    """The project's tiny byte-level tokenizer with Llama-3's special tokens and chat template."""
    from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIAL}, replace_extra_special_tokens=False)
    tokenizer.bos_token = "<|begin_of_text|>"
    tokenizer.eos_token = "<|eot_id|>"
    tokenizer.chat_template = LLAMA3_CHAT_TEMPLATE
    return tokenizer


def random_model(kind: str, tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from llamafactory_zebra import ZebraConfig, ZebraForCausalLM

    ids = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
    }
    torch.manual_seed(0)
    if kind == "llama":
        config = LlamaConfig(
            hidden_size=16, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
            max_position_embeddings=4096, tie_word_embeddings=False, **ids,
        )  # fmt: skip
        return LlamaForCausalLM(config).to(torch.float16)
    return ZebraForCausalLM(ZebraConfig.from_preset("tiny", **ids)).to(torch.float16)


def write_models(kind: str, out: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from trl import AutoModelForCausalLMWithValueHead

    tokenizer = llama3_tokenizer()
    model = random_model(kind, tokenizer)
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    valuehead = AutoModelForCausalLMWithValueHead.from_pretrained(str(out / "model"), dtype=torch.float16)
    valuehead.save_pretrained(out / "valuehead")
    tokenizer.save_pretrained(out / "valuehead")
    head = {f"v_head.{name}": tensor.contiguous() for name, tensor in valuehead.v_head.state_dict().items()}
    save_file(head, out / "model" / "value_head.safetensors")
    linears = {name.split(".")[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    lora = LoraConfig(r=8, target_modules=sorted(linears - {"lm_head"}), init_lora_weights=False)
    get_peft_model(model.float(), lora).save_pretrained(out / "adapter")


def _read(path: Path) -> list:
    text = path.read_text(encoding="utf-8")
    return (
        [json.loads(line) for line in text.splitlines() if line.strip()]
        if path.suffix == ".jsonl"
        else json.loads(text)
    )


def _write_json(path: Path, rows: list | dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")


def system_chat(alpaca: list) -> list:
    """Two-turn conversations with a system message (the shape of the demo repository's ``system_chat``)."""
    rows = []
    for first, second in zip(alpaca[0::2], alpaca[1::2], strict=False):
        messages = [{"role": "system", "content": SYSTEM}]
        for row in (first, second):
            prompt = row["instruction"] + (f"\n{row['input']}" if row["input"] else "")
            messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": row["output"]}]
        rows.append({"messages": messages})
    return rows


def write_data(lf_data: Path, out: Path) -> None:
    cwd = out / "cwd" / "llamafactory"
    alpaca = _read(lf_data / "alpaca_en_demo.json")
    _write_json(cwd / "tiny-supervised-dataset" / "train.json", alpaca[:300])
    demo = cwd / "demo_data"
    subsets = {
        "alpaca_en_demo": ("alpaca_en_demo.json", {}),
        "c4_demo": ("c4_demo.jsonl", {"columns": {"prompt": "text"}}),
        "dpo_en_demo": (
            "dpo_en_demo.json",
            {"ranking": True, "formatting": "sharegpt",
             "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}},
        ),
        "kto_en_demo": (
            "kto_en_demo.json",
            {"formatting": "sharegpt", "columns": {"messages": "messages", "kto_tag": "label"},
             "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}},
        ),
    }  # fmt: skip
    for name, (file_name, _) in subsets.items():
        _write_json(demo / f"{name}.json", _read(lf_data / file_name))
    _write_json(demo / "system_chat.json", system_chat(alpaca))
    sharegpt_tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    subsets["system_chat"] = (
        "system_chat.json",
        {
            "formatting": "sharegpt",
            "columns": {"messages": "messages"},
            "tags": {**sharegpt_tags, "system_tag": "system"},
        },
    )
    configs = "".join(f"- config_name: {name}\n  data_files: {name}.json\n" for name in subsets)
    (demo / "README.md").write_text(f"---\nconfigs:\n{configs}---\n", encoding="utf-8")
    info = {name: {"hf_hub_url": DEMO_REPO, "subset": name, **entry} for name, (_, entry) in subsets.items()}
    repo = out / "hub" / f"datasets--{DEMO_REPO.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(DEMO_REVISION)
    _write_json(repo / "snapshots" / DEMO_REVISION / "dataset_info.json", info)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["llama", "zebra"], required=True)
    parser.add_argument("--lf-data", type=Path, required=True, help="LLaMA-Factory's data/ folder (of its tag)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    write_models(args.model, args.out)
    write_data(args.lf_data, args.out)
    out = args.out.resolve()
    print(f"cd {out / 'cwd'}")
    print(
        f"export TINY_LLAMA3={out / 'model'} TINY_LLAMA_ADAPTER={out / 'adapter'} "
        f"TINY_LLAMA_VALUEHEAD={out / 'valuehead'} HF_HUB_CACHE={out / 'hub'} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1"
    )


if __name__ == "__main__":
    main()

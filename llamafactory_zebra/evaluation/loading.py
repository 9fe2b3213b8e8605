"""Load the model under test exactly as ``llamafactory-cli chat`` does, from the same inference YAML.

LLaMA-Factory's own argument parser, tokenizer loader, template fixer and model loader (adapters,
quantisation, RoPE scaling, dtype and device placement included) are used, so a Zebra model and a
Qwen3 baseline go through one code path and the chat template matches what users chat with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    template: Any
    name: str
    dataset_dir: str
    max_position_embeddings: int | None


def read_inference_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such inference YAML")
    args = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(args, dict) or "model_name_or_path" not in args:
        raise ValueError(
            f"{path}: an inference YAML needs model_name_or_path (and usually template, adapter_name_or_path)"
        )
    check_inference_keys(path, args)
    return args


def check_inference_keys(path: Path, args: dict[str, Any]) -> None:
    """Unknown keys, named in one line before anything loads.

    ``get_infer_args`` applies the same rule (``HfArgumentParser.parse_dict`` over LLaMA-Factory's inference
    argument classes; ``ALLOW_EXTRA_ARGS=1`` lifts it), but only once the model is about to load, inside a
    20-line traceback.
    """
    import dataclasses
    import difflib

    from llamafactory.extras.misc import is_env_enabled
    from llamafactory.hparams import DataArguments, FinetuningArguments, GeneratingArguments, ModelArguments

    if is_env_enabled("ALLOW_EXTRA_ARGS"):
        return
    classes = (ModelArguments, DataArguments, FinetuningArguments, GeneratingArguments)
    known = {field.name for cls in classes for field in dataclasses.fields(cls) if field.init}
    unknown = [key for key in args if key not in known]
    if not unknown:
        return
    named = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), known, n=1)
        named.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise ValueError(
        f"{path}: unknown key(s) {', '.join(named)}; an inference YAML takes the keys of `llamafactory-cli chat` "
        "(LLaMA-Factory's model, data, finetuning and generating arguments)"
    )


def max_positions(model_name_or_path: str, trust_remote_code: bool = False) -> int | None:
    """``max_position_embeddings`` from the model's config, read before any weight is loaded."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_name_or_path, trust_remote_code=trust_remote_code)
    return getattr(config, "max_position_embeddings", None)


def load_for_evaluation(args: dict[str, Any]) -> LoadedModel:
    from llamafactory.data import get_template_and_fix_tokenizer
    from llamafactory.hparams import get_infer_args
    from llamafactory.model import load_model, load_tokenizer

    model_args, data_args, finetuning_args, _ = get_infer_args(dict(args))
    tokenizer = load_tokenizer(model_args)["tokenizer"]
    tokenizer.padding_side = "left"
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    model = load_model(tokenizer, model_args, finetuning_args, is_trainable=False)
    model.eval()
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        template=template,
        name=str(args.get("adapter_name_or_path") or args["model_name_or_path"]),
        dataset_dir=data_args.dataset_dir,
        max_position_embeddings=getattr(model.config, "max_position_embeddings", None),
    )

"""``llamafactory-zebra init PRESET OUTPUT_DIR``: a randomly initialised Zebra model plus a tokenizer.

There is no hub access on CI machines and the released models are 9 GB, so the quickstart and the
tests train a tiny Zebra built here, offline, with a byte-level tokenizer that carries Qwen3's ChatML
special tokens and chat template.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..presets import CPU_PRESETS, PRESETS, preset_name
from .commands import SUBCOMMANDS

LARGE_PRESET_PARAMETERS = 100_000_000


def write_random_model(preset: str, output_dir: str | Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Save ``ZebraForCausalLM(ZebraConfig.from_preset(preset))`` and the tiny tokenizer to ``output_dir``."""
    import torch

    from .. import ZebraConfig, ZebraForCausalLM
    from ..testing.tokenizer import build_tiny_tokenizer

    output = Path(output_dir)
    tokenizer = build_tiny_tokenizer()
    overrides = {
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        "bos_token_id": None,
    }
    if preset in CPU_PRESETS:
        overrides["vocab_size"] = len(tokenizer)
    elif len(tokenizer) > PRESETS[preset]["vocab_size"]:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, more than preset {preset}'s vocab_size")
    config = ZebraConfig.from_preset(preset, **overrides)
    torch.manual_seed(seed)
    model = ZebraForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = overrides["eos_token_id"]
    model.generation_config.pad_token_id = overrides["pad_token_id"]
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output)
    tokenizer.save_pretrained(output)
    return output


def run(args: argparse.Namespace) -> int:
    try:
        args.preset = preset_name(args.preset)
    except ValueError as error:
        print(f"error: {error}")
        return 2
    output = Path(args.output_dir)
    if output.exists() and any(output.iterdir()) and not args.overwrite:
        print(f"error: {output} is not empty; pass --overwrite to replace its model files")
        return 2
    if args.preset not in CPU_PRESETS and not args.allow_large:
        print(f"error: preset {args.preset!r} has billions of parameters; pass --allow-large to write it anyway")
        return 2
    path = write_random_model(args.preset, output, seed=args.seed, dtype=args.dtype)
    print(f"wrote a random {args.preset} Zebra model and tokenizer to {path}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("init", help=SUBCOMMANDS["init"].help)
    parser.add_argument(
        "preset", help=f"one of: {', '.join(sorted(PRESETS))} (tiny, tiny-16k for CPU work; AMD's HyLo names work too)"
    )
    parser.add_argument("output_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--overwrite", action="store_true", help="write into a non-empty directory")
    parser.add_argument("--allow-large", action="store_true", help="allow presets of real size (GBs on disk)")
    parser.set_defaults(func=run)

"""``llamafactory-zebra import RELEASED_DIR OUTPUT_DIR``: released layout → native Zebra checkpoint.

Loading the released directory directly also works (``ZebraForCausalLM.from_pretrained`` and
LLaMA-Factory with the plugin both detect ``hybrid_config.json``); this command is for tools that go
through ``AutoConfig`` alone, which reads AMD's ``config.json`` as the Qwen3 model it describes. The
logic is ``released/import_checkpoint.py``.
"""

from __future__ import annotations

import argparse

from .commands import SUBCOMMANDS


def run(args: argparse.Namespace) -> int:
    from ..released.import_checkpoint import import_released_checkpoint

    try:
        path = import_released_checkpoint(args.released_dir, args.output_dir, link=not args.copy)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}")
        return 2
    print(f"wrote a native Zebra checkpoint to {path}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("import", help=SUBCOMMANDS["import"].help)
    parser.add_argument("released_dir", help="directory with config.json, hybrid_config.json and *.safetensors")
    parser.add_argument("output_dir")
    parser.add_argument("--copy", action="store_true", help="copy weight files instead of hard-linking them")
    parser.set_defaults(func=run)

"""``llamafactory-zebra verify MODEL_DIR``: does the checkpoint run under the right MLA convention?

Run once on a fresh download (either layout). It loads the weights, scores a few paragraphs of plain
English under each plausible RoPE pairing and MLA norm placement (``released/verify.py``) and prints a
table. Exit status: 0 when the configured convention fits clearly best, 1 when another wins (the
message names the setting to change), 2 when the checkpoint does not load, 3 when the scores cannot
tell the conventions apart (an untrained or broken model).
"""

from __future__ import annotations

import argparse

from .commands import SUBCOMMANDS


def run(args: argparse.Namespace) -> int:
    from ..released.verify import CheckpointNotLoadable, verify_checkpoint

    try:
        report, status = verify_checkpoint(args.model_dir, args.dtype, args.max_tokens)
    except CheckpointNotLoadable as error:
        print(f"llamafactory-zebra verify: {error}")
        return 2
    print(report)
    return status


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("verify", help=SUBCOMMANDS["verify"].help)
    parser.add_argument("model_dir", help="a Zebra checkpoint directory (native or AMD's released layout)")
    parser.add_argument("--max-tokens", type=int, default=512, help="tokens of the built-in text to score (512)")
    parser.add_argument(
        "--dtype", choices=["auto", "bfloat16", "float32"], default="auto", help="auto: bf16 where the CPU has it"
    )
    parser.set_defaults(func=run)

"""``llamafactory-zebra verify MODEL_DIR``: does the checkpoint run under the right MLA convention?

Run once on a fresh download (either layout). It loads the weights, scores a few paragraphs of plain
English under each plausible RoPE pairing and MLA norm placement (``verification.py``) and prints a
table; exit status 0 when the configured convention has the lowest perplexity, 1 when another wins (the
message names the setting to change), 2 when the checkpoint does not load.
"""

from __future__ import annotations

import argparse
import time


def run(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoTokenizer

    from .. import ZebraForCausalLM
    from ..verification import configured_convention, pick_dtype, render, score_conventions, verification_tokens

    dtype = pick_dtype(args.dtype)
    started = time.monotonic()
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
        model = ZebraForCausalLM.from_pretrained(args.model_dir, dtype=dtype, attn_implementation="sdpa").eval()
        input_ids = verification_tokens(tokenizer, args.max_tokens)
    except (OSError, ValueError) as error:
        print(f"llamafactory-zebra verify: {error}")
        return 2
    if torch.cuda.is_available():
        model, input_ids = model.cuda(), input_ids.cuda()
    scores = score_conventions(model, input_ids)
    table, ok = render(scores, configured_convention(model.config), args.model_dir)
    print(f"{args.model_dir}: {input_ids.shape[1]} tokens, {dtype}, {time.monotonic() - started:.0f} s")
    print(table)
    return 0 if ok else 1


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("verify", help="check a checkpoint's MLA convention by perplexity")
    parser.add_argument("model_dir", help="a Zebra checkpoint directory (native or AMD's released layout)")
    parser.add_argument("--max-tokens", type=int, default=512, help="tokens of the built-in text to score (512)")
    parser.add_argument(
        "--dtype", choices=["auto", "bfloat16", "float32"], default="auto", help="auto: bf16 where the CPU has it"
    )
    parser.set_defaults(func=run)

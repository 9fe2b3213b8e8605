"""``llamafactory-zebra convert BASE OUT``: build a Zebra hybrid from a Qwen3 or Llama-3 checkpoint.

Thin wrapper over ``llamafactory_zebra.convert.convert_checkpoint``: parses the plan and rank options,
prints the layer scores (sensitivity selection) and the conversion report table.
"""

from __future__ import annotations

import argparse

from .commands import SUBCOMMANDS


def _layer_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated layer indices such as 1,5,9; got {text!r}"
        ) from None


def run(args: argparse.Namespace) -> int:
    from ..convert import ConversionInputError, ConversionOptions, convert_checkpoint

    options = ConversionOptions(
        plan=args.plan,
        mla_layers=args.mla_layers,
        num_mla=args.num_mla,
        select=args.select,
        data=args.data,
        score_tokens=args.score_tokens,
        q_lora_rank=args.q_lora_rank,
        kv_lora_rank=args.kv_lora_rank,
        qk_rope_head_dim=args.qk_rope_head_dim,
        gdn_heads=args.gdn_heads,
        gdn_head_dim=args.gdn_head_dim,
        dtype=args.dtype,
        allow_single_kind=args.allow_single_kind,
        seed=args.seed,
        max_shard_bytes=int(args.max_shard_gb * 1024**3),
    )
    try:
        result = convert_checkpoint(args.base, args.output, options, overwrite=args.overwrite)
    except ConversionInputError as error:
        print(f"error: {error}")
        return 2
    if result.scores is not None:
        print("layer sensitivity (KL of the base's next-token distribution when only this layer becomes GDN):")
        for layer, score in sorted(result.scores["scores"].items(), key=lambda item: int(item[0])):
            mark = "MLA" if int(layer) in result.scores["mla_layers"] else "GDN"
            print(f"  layer {int(layer):>3}  KL {score:.6f}  -> {mark}")
    print(result.report.table())
    print(f"wrote a Zebra checkpoint ({result.report.seconds:.1f} s) to {result.output}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert",
        help=SUBCOMMANDS["convert"].help,
        description="Initialise a Zebra hybrid from a Transformer: MLA layers by truncated SVD of the attention "
        "weights, GDN layers by copying them, everything else verbatim. Defaults reproduce the released "
        "7MLA21GDN plan and ranks for Qwen3-1.7B and scale with the base (docs/convert.md).",
    )
    parser.add_argument("base", help="Qwen3 (dense) or Llama-3 directory in the transformers layout (safetensors)")
    parser.add_argument("output", help="directory for the Zebra checkpoint")
    plan = parser.add_mutually_exclusive_group()
    plan.add_argument("--plan", help="layer counts, e.g. 7mla21gdn (MLA layers evenly spaced)")
    plan.add_argument("--mla-layers", type=_layer_list, help="explicit MLA layer indices, e.g. 1,5,9,13")
    plan.add_argument("--num-mla", type=int, help="number of MLA layers (default: a quarter of the layers)")
    parser.add_argument(
        "--select",
        choices=["uniform", "sensitivity"],
        default="uniform",
        help="how --num-mla/--plan places the MLA layers (sensitivity: KL on --data)",
    )
    parser.add_argument("--data", help="text, JSON or JSONL file for --select sensitivity")
    parser.add_argument("--score-tokens", type=int, default=256, help="tokens of --data to score on (default 256)")
    parser.add_argument(
        "--q-lora-rank", type=int, help="rank of W_Q's factors (default 21/32 of hidden, 1344 for 1.7B)"
    )
    parser.add_argument("--kv-lora-rank", type=int, help="latent size (default kv_heads*head_dim/4, 256 for 1.7B)")
    parser.add_argument("--qk-rope-head-dim", type=int, help="rotary dims per MLA head (default head_dim/2)")
    parser.add_argument("--gdn-heads", type=int, help="GDN heads (default round(0.75*hidden/gdn_head_dim))")
    parser.add_argument("--gdn-head-dim", type=int, help="GDN key head size (default 2*head_dim)")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="weights dtype (default: the base's)")
    parser.add_argument("--allow-single-kind", action="store_true", help="allow an all-MLA or all-GDN plan")
    parser.add_argument("--seed", type=int, default=0, help="seed of the freshly initialised GDN parameters")
    parser.add_argument("--max-shard-gb", type=float, default=2.0, help="size of each output shard (default 2 GB)")
    parser.add_argument("--overwrite", action="store_true", help="write into a non-empty OUT")
    parser.set_defaults(func=run)

"""``llamafactory-zebra data inspect TRAIN.yaml``, ``data list`` and the generators (``data retrieval-sft``,
``data passkey-sft``).

Before an 80-hour run: how many rows each dataset keeps and why the others are dropped, how long
the rows are, how they pack into ``cutoff_len`` and how many optimizer steps that makes.

A generator writes a dataset offline, sized in the model's own tokens: its subcommand takes the flags every
generated dataset shares (:func:`add_generated_dataset_arguments`) beside its own, and its ``run`` builds the
rows and hands them to :func:`write_generated` (``retrieval-sft`` is the pattern a new one copies).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .commands import SUBCOMMANDS

DEFAULT_OUTPUT_DIR = "data_inspect"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("data", help=SUBCOMMANDS["data"].help)
    commands = parser.add_subparsers(dest="data_command", metavar="DATA_COMMAND")

    inspect_parser = commands.add_parser("inspect", help="packing report for a LLaMA-Factory training YAML")
    inspect_parser.add_argument("config", help="the training YAML (as given to llamafactory-cli train)")
    inspect_parser.add_argument(
        "--max-rows", type=int, default=None, help="rows to read per dataset (default: all; 10000 when streaming)"
    )
    inspect_parser.add_argument(
        "--output-dir", default=DEFAULT_OUTPUT_DIR, help="where report.json and token_lengths.png go"
    )
    inspect_parser.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="training processes (GPUs); divided by the YAML's sequence_parallel_size for data-parallel ranks "
        "(default: one sequence-parallel group)",
    )
    inspect_parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    inspect_parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    inspect_parser.set_defaults(func=run_inspect)

    list_parser = commands.add_parser("list", help="the recipe datasets usable by name in `dataset:`")
    list_parser.add_argument("--json", action="store_true", help="print the dataset_info entries as JSON")
    list_parser.set_defaults(func=run_list)

    retrieval = commands.add_parser(
        "retrieval-sft",
        help="write long-context retrieval SFT rows (needles, several keys/values, variable tracking)",
        description="Write long-context retrieval SFT rows (sharegpt) and their dataset_info.json entry; "
        "none of them is an eval-long sample.",
    )
    add_generated_dataset_arguments(retrieval)
    _add_retrieval_arguments(retrieval)
    retrieval.set_defaults(func=run_retrieval_sft)

    passkey = commands.add_parser(
        "passkey-sft",
        help="write passkey SFT rows (eval-long's passkey wording, keys of 3-8 digits, some other filler)",
        description="Write passkey retrieval SFT rows (sharegpt) and their dataset_info.json entry; none of them "
        "is an eval-long sample (a key of eval-long's length only ever sits in the grammar's filler).",
    )
    add_generated_dataset_arguments(passkey)
    _add_passkey_arguments(passkey)
    passkey.set_defaults(func=run_passkey_sft)

    parser.set_defaults(func=lambda args: _missing_command(parser))


def span(text: str) -> tuple[int, int]:
    """``256-1024`` → ``(256, 1024)``; ``8192`` → ``(8192, 8192)`` (an inclusive range of counts)."""
    low, _, high = text.partition("-")
    try:
        return int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a count or a range, e.g. 8192 or 256-1024") from None


def add_generated_dataset_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of every generator: the tokenizer and template that size the rows, where they go, how many."""
    parser.add_argument("--model", required=True, help="model directory whose tokenizer sizes the rows")
    parser.add_argument("--template", default="zebra", help="LLaMA-Factory template the training YAML uses")
    parser.add_argument("--output-dir", required=True, help="dataset_dir of the training YAML")
    parser.add_argument("--name", required=True, help="dataset name (the file is NAME.json)")
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--lengths", type=span, required=True, help="tokens per row, e.g. 256-1024 or 8192")
    parser.add_argument("--seed", type=int, default=0)


def write_generated(args: argparse.Namespace, make_rows: Callable[..., list[dict[str, Any]]]) -> int:
    """Checks the shared flags, makes the rows, writes ``NAME.json`` and its ``dataset_info.json`` entry.

    ``make_rows(measure, encode)`` gets the row's token count and the text encoder that
    ``data.retrieval_sft.template_measure`` builds from ``--model`` and ``--template``.
    """
    from ..data.retrieval_sft import template_measure, write_dataset

    if args.rows < 1 or args.lengths[0] < 1 or args.lengths[0] > args.lengths[1]:
        low, high = args.lengths
        print(
            f"error: --rows {args.rows} --lengths {low}-{high}: need rows >= 1 and 1 <= low <= high", file=sys.stderr
        )
        return 2
    measure, encode = template_measure(args.model, args.template)
    rows = make_rows(measure, encode)
    path = write_dataset(args.output_dir, args.name, rows)
    sizes = [measure(row["messages"]) for row in rows]
    print(f"wrote {len(rows)} rows of {min(sizes)}-{max(sizes)} tokens ({sum(sizes):,} in all) to {path}")
    return 0


def _add_retrieval_arguments(parser: argparse.ArgumentParser) -> None:
    from ..data.retrieval_sft import RetrievalOptions

    parser.add_argument("--needles", type=span, default=RetrievalOptions.needles, help="needles per row, e.g. 1-4")
    parser.add_argument("--questions", type=int, default=RetrievalOptions.questions, help="questions per row")
    parser.add_argument("--multivalue-share", type=float, default=RetrievalOptions.multivalue_share)
    parser.add_argument("--tracking-share", type=float, default=RetrievalOptions.tracking_share)
    parser.add_argument(
        "--noise-filler-share",
        type=float,
        default=RetrievalOptions.noise_filler_share,
        help="rows whose filler is eval-long's noise haystack instead of the grammar's sentences",
    )


def run_retrieval_sft(args: argparse.Namespace) -> int:
    from ..data.retrieval_sft import RetrievalOptions, make_rows

    try:
        options = RetrievalOptions(
            needles=args.needles,
            questions=args.questions,
            multivalue_share=args.multivalue_share,
            tracking_share=args.tracking_share,
            noise_filler_share=args.noise_filler_share,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return write_generated(
        args, lambda measure, encode: make_rows(args.rows, args.lengths, args.seed, measure, encode, options)
    )


def _add_passkey_arguments(parser: argparse.ArgumentParser) -> None:
    from ..data.passkey_sft import PasskeyOptions

    parser.add_argument(
        "--key-digits",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=PasskeyOptions.key_digits,
        help="digit counts of the keys, comma-separated (eval-long's only with the grammar's filler)",
    )
    parser.add_argument(
        "--other-filler-share",
        type=float,
        default=PasskeyOptions.other_filler_share,
        help="rows whose filler is the retrieval grammar's sentences instead of the standard filler",
    )
    parser.add_argument(
        "--instruction-share",
        type=float,
        default=PasskeyOptions.instruction_share,
        help="rows that open with the papers' instruction (a row too short for it goes without)",
    )


def run_passkey_sft(args: argparse.Namespace) -> int:
    from ..data.passkey_sft import PasskeyOptions, make_passkey_rows

    try:
        options = PasskeyOptions(
            key_digits=args.key_digits,
            other_filler_share=args.other_filler_share,
            instruction_share=args.instruction_share,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return write_generated(
        args, lambda measure, encode: make_passkey_rows(args.rows, args.lengths, args.seed, measure, encode, options)
    )


def _missing_command(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def run_list(args: argparse.Namespace) -> int:
    from ..data.registry import registry_dataset_info

    info = registry_dataset_info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for name, entry in info.items():
        source = entry.get("hf_hub_url") or entry.get("file_name")
        where = " ".join(part for part in (entry.get("subset"), entry.get("split")) if part)
        print(f"{name:34s} {entry['formatting']:26s} {source} {where}".rstrip())
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    from ..data.histogram import write_length_histogram
    from ..data.inspection import inspect_training_data
    from ..integration.datasets import install_dataset_seams

    if args.max_rows is not None and args.max_rows < 1:
        print("error: --max-rows must be at least 1", file=sys.stderr)
        return 2
    install_dataset_seams()  # also in a process without the import hook
    try:
        report = inspect_training_data(
            args.config,
            max_rows=args.max_rows,
            world_size=args.world_size,
            show_progress=not args.no_progress and not args.json,
        )
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    output_dir = Path(args.output_dir)
    histogram = write_length_histogram(report.lengths, report.settings["cutoff_len"], output_dir / "token_lengths.png")
    result = {**report.to_dict(), "histogram": str(histogram)}
    (output_dir / "report.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0


def _number(value: float) -> str:
    return f"{value:,.0f}"


def format_report(result: dict[str, Any]) -> str:
    settings = result["settings"]
    lines = [
        f"data inspect: {result['config']}",
        f"model {settings['model']} | template {settings['template']} | cutoff_len {settings['cutoff_len']:,} | "
        f"packing {'neat' if settings['neat_packing'] else 'on' if settings['packing'] else 'off'} | "
        f"streaming {'on' if settings['streaming'] else 'off'}"
        + (f" | row limit {settings['row_limit']:,}/dataset" if settings["row_limit"] else ""),
        f"per step: {settings['per_device_train_batch_size']} per device x {settings['gradient_accumulation_steps']} "
        f"accumulation x {settings['data_parallel_size']} data-parallel ranks (world size {settings['world_size']}, "
        f"sequence parallel {settings['sequence_parallel_size']}) = {settings['sequences_per_step']} sequences",
        "",
    ]
    header = (
        "dataset",
        "read",
        "kept",
        "dropped",
        "trunc",
        "p50",
        "p90",
        "p99",
        "max",
        "tokens",
        "packed",
        "eff",
        "steps",
    )
    rows = [header]
    for report in result["datasets"] + [result["mixture"]]:
        lengths = report["token_lengths"]
        rows.append(
            (
                report["name"],
                _number(report["rows_read"]),
                _number(report["rows_kept"]),
                _number(sum(report["rows_dropped"].values())),
                _number(report["rows_truncated"]),
                *(_number(lengths[key]) if lengths else "-" for key in ("p50", "p90", "p99", "max")),
                _number(report["train_tokens"]),
                _number(report["packed_sequences"]),
                f"{report['packing_efficiency']:.1%}",
                _number(report["steps_per_epoch"]),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
    lines.append("")
    lines.append(
        "packed = sequences of cutoff_len tokens (LLaMA-Factory's greedy knapsack per preprocessing batch); "
        "eff = non-pad share; steps = optimizer steps per epoch; "
        f"total steps {settings['total_steps']:,}"
        + (" (max_steps)" if settings["max_steps"] > 0 else f" ({settings['num_train_epochs']:g} epochs)")
    )
    for report in result["datasets"] + [result["mixture"]]:
        for note in report["notes"]:
            lines.append(f"note [{report['name']}]: {note}")
    for report in result["datasets"]:
        for kind, count in report["rows_dropped"].items():
            shown = ", ".join(map(str, report["dropped_rows"][kind]))
            more = " ..." if count > len(report["dropped_rows"][kind]) else ""
            lines.append(
                f"dropped [{report['name']}] {kind} x{count}: rows {shown}{more} "
                f"(first: {report['first_drop_detail'][kind]})"
            )
    lines.append(f"histogram: {result['histogram']}")
    return "\n".join(lines)

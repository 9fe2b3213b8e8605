"""``llamafactory-zebra data inspect TRAIN.yaml`` and ``data list``.

Before an 80-hour run: how many rows each dataset keeps and why the others are dropped, how long
the rows are, how they pack into ``cutoff_len`` and how many optimizer steps that makes.
"""

from __future__ import annotations

import argparse
import json
import sys
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

    parser.set_defaults(func=lambda args: _missing_command(parser))


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

"""``llamafactory-zebra eval-long compare LABEL=DIR ...``: several ``eval-long`` reports in one table.

A subcommand of the ``eval-long`` group (``eval_long_cmd.py``); ``eval-long-compare``, its spelling before the
group, stays as an alias.
"""

from __future__ import annotations

import argparse
import sys

from .commands import SUBCOMMANDS


def parse_labelled(items: list[str]) -> dict[str, str]:
    """``before=DIR after=DIR`` → ``{"before": "DIR", "after": "DIR"}``, in the order given."""
    labelled = {}
    for item in items:
        label, separator, path = item.partition("=")
        if not separator or not label or not path:
            raise ValueError(f"{item!r}: give LABEL=PATH, e.g. before=saves/longctx/eval_before")
        labelled[label] = path
    return labelled


def run(args: argparse.Namespace) -> int:
    from ..evaluation.compare import comparison_table, read_report

    try:
        reports = {label: read_report(path) for label, path in parse_labelled(args.reports).items()}
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(comparison_table(reports))
    return 0


DESCRIPTION = (
    "Rows task x length (the first report's), one score column (percent) per labelled report; "
    "a cell a report did not measure shows '-'."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("reports", nargs="+", help="LABEL=PATH: an eval-long output directory or its report.json")
    parser.set_defaults(func=run)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``eval-long-compare``, the alias."""
    add_arguments(
        subparsers.add_parser("eval-long-compare", help=SUBCOMMANDS["eval-long-compare"].help, description=DESCRIPTION)
    )

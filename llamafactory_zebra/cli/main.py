"""Entry point of the ``llamafactory-zebra`` console script.

Subcommand modules are imported only when their command runs, so ``llamafactory-zebra doctor`` does not
pay for importing torch through ``init``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .commands import SUBCOMMANDS


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llamafactory-zebra", description="Zebra hybrid models for LLaMA-Factory")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        if name == chosen:
            importlib.import_module(module_name).add_parser(subparsers)
        else:
            subparsers.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0 if args.command is None else 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

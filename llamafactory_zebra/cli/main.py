"""Entry point of the ``llamafactory-zebra`` console script.

Subcommand modules are imported only when their command runs, so ``llamafactory-zebra doctor`` does not
pay for importing torch through ``init``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .commands import SUBCOMMANDS


def with_default_subcommand(argv: list[str]) -> list[str]:
    """``argv`` with a group's default subcommand inserted where the word after the group is none of its
    subcommands (``eval-long INFER.yaml`` → ``eval-long run INFER.yaml``); ``--help`` still shows the group."""
    index = next((i for i, arg in enumerate(argv) if not arg.startswith("-")), None)
    if index is None or argv[index] not in SUBCOMMANDS:
        return argv
    command, rest = SUBCOMMANDS[argv[index]], argv[index + 1 :]
    if command.default is None or not rest or rest[0] in (*command.subcommands, "-h", "--help"):
        return argv
    return [*argv[: index + 1], command.default, *rest]


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llamafactory-zebra", description="Zebra hybrid models for LLaMA-Factory")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, command in SUBCOMMANDS.items():
        if name == chosen:
            importlib.import_module(command.module).add_parser(subparsers)
        else:
            subparsers.add_parser(name, help=command.help, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = with_default_subcommand(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0 if args.command is None else 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

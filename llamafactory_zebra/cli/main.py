"""Entry point of the ``llamafactory-zebra`` console script.

Subcommand modules are imported only when their command runs, so ``llamafactory-zebra doctor`` does not
pay for importing torch through ``init``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command name -> (module, one-line help). Each module exposes ``add_parser(subparsers)``, which sets ``func``.
SUBCOMMANDS = {
    "init": (
        "llamafactory_zebra.cli.init_cmd",
        "write a small random Zebra model and tokenizer (for quickstarts and tests)",
    ),
    "convert": (
        "llamafactory_zebra.cli.convert_cmd",
        "build a Zebra hybrid (MLA + GDN) from a Qwen3 or Llama-3 checkpoint",
    ),
    "import": ("llamafactory_zebra.cli.import_cmd", "convert a checkpoint in AMD's released layout to a native one"),
    "data": ("llamafactory_zebra.cli.data_cmd", "inspect how datasets tokenize and pack (data inspect TRAIN.yaml)"),
    "verify": (
        "llamafactory_zebra.cli.verify_cmd",
        "check by perplexity that a downloaded checkpoint runs with the right MLA convention",
    ),
    "doctor": ("llamafactory_zebra.cli.doctor", "check the GPU/ROCm/CUDA software environment"),
    "plan": ("llamafactory_zebra.cli.plan", "estimate per-GPU memory of a training YAML"),
    "eval-long": ("llamafactory_zebra.cli.eval_long_cmd", "RULER-style long-context scores of an inference YAML"),
}


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

"""``llamafactory-zebra eval-long``: the long-context evaluation commands, one group as ``data`` is one.

- ``eval-long run INFER.yaml``: RULER-style scores of a model (``eval_long_run_cmd.py``);
- ``eval-long compare LABEL=DIR ...``: several reports in one table (``eval_long_compare_cmd.py``);
- ``eval-long curve INFER.yaml --stages DIR ...``: scores of a run's checkpoints against training tokens
  (``eval_long_curve_cmd.py``).

``eval-long INFER.yaml ...`` without a subcommand is ``eval-long run INFER.yaml ...``, the command's spelling before
the group (``main`` inserts ``run``: :data:`~.commands.SUBCOMMANDS` names it the group's default), and
``eval-long-compare`` / ``eval-long-curve`` stay as aliases. A YAML literally named ``compare`` or ``curve`` needs
the explicit ``eval-long run compare``.
"""

from __future__ import annotations

import argparse

from . import eval_long_compare_cmd, eval_long_curve_cmd, eval_long_run_cmd
from .commands import SUBCOMMANDS

# Each subcommand (``SUBCOMMANDS["eval-long"].subcommands``, in its order): its help line and its module, which
# adds its arguments (``add_arguments``, which sets ``func``) and may describe itself (``DESCRIPTION``).
SUBCOMMAND_MODULES = {
    "run": ("RULER-style long-context scores of a model from its inference YAML", eval_long_run_cmd),
    "compare": ("eval-long reports side by side (before/after, model/model)", eval_long_compare_cmd),
    "curve": (
        "eval-long scores of a run's checkpoints against training tokens (a learning curve and its picture)",
        eval_long_curve_cmd,
    ),
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    help_text = SUBCOMMANDS["eval-long"].help
    parser = subparsers.add_parser("eval-long", help=help_text, description=help_text)
    commands = parser.add_subparsers(dest="eval_long_command", metavar="EVAL_LONG_COMMAND")
    for name, (help_text, module) in SUBCOMMAND_MODULES.items():
        description = getattr(module, "DESCRIPTION", help_text)
        module.add_arguments(commands.add_parser(name, help=help_text, description=description))
    parser.set_defaults(func=lambda args: _missing_command(parser))


def _missing_command(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2

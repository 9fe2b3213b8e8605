"""The subcommands of ``llamafactory-zebra``: for each, the module that runs it and its one-line help.

Written once, here: ``main`` lists every command from this table without importing the modules (so
``llamafactory-zebra doctor`` does not pay for importing torch through ``init``), and each module's
``add_parser(subparsers)`` (which sets ``func``) reads its own help line from it.
"""

from __future__ import annotations

from typing import NamedTuple


class Subcommand(NamedTuple):
    module: str
    help: str
    # A command group's subcommands, and the one ``main`` runs when the next word is none of them (the spelling
    # from before the group: ``eval-long INFER.yaml`` is ``eval-long run INFER.yaml``).
    subcommands: tuple[str, ...] = ()
    default: str | None = None


SUBCOMMANDS = {
    "init": Subcommand(
        "llamafactory_zebra.cli.init_cmd",
        "write a small random Zebra model and tokenizer (for quickstarts and tests)",
    ),
    "convert": Subcommand(
        "llamafactory_zebra.cli.convert_cmd",
        "build a Zebra hybrid (MLA + GDN) from a Qwen3 or Llama-3 checkpoint",
    ),
    "import": Subcommand(
        "llamafactory_zebra.cli.import_cmd", "convert a checkpoint in AMD's released layout to a native one"
    ),
    "data": Subcommand(
        "llamafactory_zebra.cli.data_cmd",
        "inspect how datasets tokenize and pack; list registry datasets; write generated training data",
    ),
    "verify": Subcommand(
        "llamafactory_zebra.cli.verify_cmd",
        "check by perplexity that a downloaded checkpoint runs with the right MLA convention",
    ),
    "doctor": Subcommand("llamafactory_zebra.cli.doctor_cmd", "check the GPU/ROCm/CUDA software environment"),
    "build-kernels": Subcommand(
        "llamafactory_zebra.cli.build_kernels_cmd",
        "build the C++ CPU kernels now (once per install, a few minutes) instead of in the first inference",
    ),
    "plan": Subcommand("llamafactory_zebra.cli.plan_cmd", "estimate per-GPU memory of a training YAML"),
    "eval-long": Subcommand(
        "llamafactory_zebra.cli.eval_long_cmd",
        "long-context evaluation: run (RULER-style scores), compare (reports side by side), curve (over checkpoints)",
        subcommands=("run", "compare", "curve"),
        default="run",
    ),
    "eval-long-compare": Subcommand("llamafactory_zebra.cli.eval_long_compare_cmd", "alias of `eval-long compare`"),
    "eval-long-curve": Subcommand("llamafactory_zebra.cli.eval_long_curve_cmd", "alias of `eval-long curve`"),
}

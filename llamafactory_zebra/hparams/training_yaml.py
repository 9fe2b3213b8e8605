"""The one reader of a LLaMA-Factory training YAML for the plugin's tools (``plan``, ``data inspect``).

It loads the file as ``llamafactory.hparams.parser.read_args`` does (OmegaConf, so interpolations
resolve the same way) and only checks what every tool needs: the file exists and holds a mapping.
Each tool takes the plugin's keys out with ``zebra_args.pop_zebra_arguments`` and parses the rest into
the subset of LLaMA-Factory's dataclasses it needs (the planner cannot run
``TrainingArguments.__post_init__`` on a machine without the GPUs).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def read_training_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """The YAML's keys and values; ``ValueError`` naming the file when it is missing or not a mapping."""
    from omegaconf import OmegaConf

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{path}: no such training YAML")
    values = OmegaConf.to_container(OmegaConf.load(file.absolute()))
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of LLaMA-Factory arguments, got {type(values).__name__}")
    return values

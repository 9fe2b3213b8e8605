"""The one reader of a LLaMA-Factory training YAML for the plugin's tools (``plan``, ``data inspect``).

It loads the file as ``llamafactory.hparams.parser.read_args`` does (OmegaConf, so interpolations
resolve the same way) and only checks what every tool needs: the file exists and holds a mapping.
:func:`read_run_arguments` then parses it into ``run_arguments.RunArguments`` (the plugin's keys and
LLaMA-Factory's dataclasses; the planner leaves ``TrainingArguments`` out, whose ``__post_init__``
checks the current machine).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .run_arguments import RunArguments, parse_run_arguments


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


def read_run_arguments(
    path: str | os.PathLike,
    parse_training: bool = True,
    ignore: tuple[str, ...] = (),
    overrides: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], RunArguments]:
    """The YAML's values (as read) and its arguments parsed, without the ``ignore`` keys and with
    ``overrides`` replacing values. Errors name the file."""
    values = read_training_yaml(path)
    kept = {key: value for key, value in values.items() if key not in ignore}
    try:
        return values, parse_run_arguments({**kept, **(overrides or {})}, parse_training)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None

"""The dataset seams: recipe datasets by name from any ``dataset_dir``, in the web UI, with converters.

LLaMA-Factory reads dataset names only from ``dataset_dir/dataset_info.json`` (training:
``data.parser.get_dataset_list``; web UI: ``webui.common.load_dataset_info``) and picks converters
from ``data.converter.DATASET_CONVERTERS``. The activation hook installs :data:`SEAMS` right after each
module is imported (``seams.install``); each wrapper makes the user's own entries come first (and win
on a name clash) and adds the registry's names behind them.

Seams (module → name, parameters relied on):
- ``data.converter.register_dataset_converter(name, dataset_converter)``: our converters.
- ``data.converter.get_dataset_converter(name, dataset_attr, data_args)``: every converter runs
  behind ``GuardedConverter`` (clear schema errors, counted drops; see ``data/validation.py``); its rows
  hold LLaMA-Factory's keys only, except while ``_load_single_dataset`` below collects drop reasons.
- ``data.parser.get_dataset_list(dataset_names, dataset_dir)``: called with the merged entries as a
  dict, which upstream accepts in place of a directory.
- ``data.loader._get_merged_dataset(dataset_names, model_args, data_args, training_args, stage)``: the
  run's stage, which upstream's converters never see, is recorded while its datasets load, so rows are
  checked for the processor that consumes them (``data/stages.py``); an entry the stage cannot train on
  is refused first, naming the dataset_info.json keys to change.
- ``data.loader._load_single_dataset(dataset_attr, model_args, data_args, training_args)``: an empty file,
  a file that ``datasets`` cannot load, or rows the guard refused, become one error naming the dataset,
  file, row, line and field (``data/row_policy.py``), unless the entry sets ``"skip_invalid_rows": true``.
  The guard's drop reasons come back as a column of the converted rows, which this seam removes.
- ``data.loader._get_preprocessed_dataset(dataset, data_args, training_args, stage, template, tokenizer,
  processor, is_eval)``: SFT rows longer than ``cutoff_len``, which upstream truncates silently, are counted
  and warned about before tokenisation, naming the fix (``data/cutoff.py``).
- ``webui.common.load_dataset_info(dataset_dir)``: the dataset dropdown.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..data.registry import merge_dataset_info, registry_dataset_info
from ..data.row_policy import SKIP_ATTRIBUTE, SKIP_KEY
from ..seam import Seam, UpstreamSeamChanged, install, original
from . import SEAM_HINT

if TYPE_CHECKING:
    from llamafactory.data.parser import DatasetAttr
    from llamafactory.hparams import DataArguments

DATA_CONFIG = "dataset_info.json"


def _is_remote(dataset_dir: Any) -> bool:
    """``ONLINE`` (names are hub ids) and ``REMOTE:<repo>`` (config on the hub) stay upstream's business."""
    return isinstance(dataset_dir, str) and (dataset_dir == "ONLINE" or dataset_dir.startswith("REMOTE:"))


def read_user_dataset_info(dataset_dir: str | dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The user's entries and a label for error messages; a missing file means no user entries."""
    if isinstance(dataset_dir, dict):
        return dataset_dir, "the dataset_dir dict"
    path = os.path.join(dataset_dir, DATA_CONFIG)
    if not os.path.isfile(path):
        return {}, path
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"Cannot read {path}: {err}") from err
    if not isinstance(info, dict):
        raise ValueError(f"{path} must hold a JSON object of dataset entries, got {type(info).__name__}")
    return info, path


def dataset_info_for(dataset_dir: str | dict[str, Any]) -> dict[str, Any]:
    """User entries (``zebra_base`` expanded) followed by the registry's."""
    user_info, source = read_user_dataset_info(dataset_dir)
    return merge_dataset_info(user_info, source)


def check_dataset_names(names: list[str], dataset_dir: str | dict[str, Any]) -> None:
    user_info, source = read_user_dataset_info(dataset_dir)
    registry = registry_dataset_info()
    unknown = [name for name in names if name not in user_info and name not in registry]
    if unknown:
        user_names = ", ".join(sorted(user_info)) or f"none ({source} not found)"
        raise ValueError(
            f"Unknown dataset {', '.join(map(repr, unknown))}. Datasets in {source}: {user_names}. "
            f"llamafactory-zebra registry: {', '.join(registry)}."
        )


def _converters(module: ModuleType) -> dict[str, Any]:
    converters = getattr(module, "DATASET_CONVERTERS", None)
    if not isinstance(converters, dict):
        raise UpstreamSeamChanged(f"{module.__name__}.DATASET_CONVERTERS is no longer a dict")
    return converters


def register_zebra_converters(module: ModuleType) -> None:
    """Our converters, through LLaMA-Factory's own ``register_dataset_converter``."""
    from ..data.converters import ZEBRA_CONVERTERS

    register, converters = original(module, "register_dataset_converter"), _converters(module)
    for name, converter_class in ZEBRA_CONVERTERS.items():
        if name not in converters:
            register(name, converter_class)


def guarded_converters(module: ModuleType) -> Any:
    """Every converter LLaMA-Factory hands out runs behind the row guard."""
    from ..data.validation import GuardedConverter, collects_drop_reasons, dataset_label

    get_converter, converters = original(module, "get_dataset_converter"), _converters(module)

    @functools.wraps(get_converter)
    def guarded_get_dataset_converter(name, dataset_attr, data_args):
        if name not in converters:
            raise ValueError(
                f"Dataset '{dataset_label(dataset_attr)}': unknown formatting {name!r}; "
                f"known: {', '.join(converters)}."
            )
        converter = get_converter(name, dataset_attr, data_args)
        return GuardedConverter(converter, name, with_reasons=collects_drop_reasons())

    return guarded_get_dataset_converter


def registry_dataset_names(module: ModuleType) -> Any:
    """``dataset:`` names resolve through the user's dataset_info.json, then the registry."""
    get_dataset_list = original(module, "get_dataset_list")

    @functools.wraps(get_dataset_list)
    def zebra_get_dataset_list(dataset_names, dataset_dir):
        if _is_remote(dataset_dir):
            return get_dataset_list(dataset_names, dataset_dir)
        names = list(dataset_names or [])
        check_dataset_names(names, dataset_dir)
        info = dataset_info_for(dataset_dir)
        attrs = get_dataset_list(names, info)
        for name, attr in zip(names, attrs, strict=True):
            attr.zebra_name = name
            setattr(attr, SKIP_ATTRIBUTE, bool(info[name].get(SKIP_KEY, False)))
        return attrs

    return zebra_get_dataset_list


def guarded_converter(dataset_attr: DatasetAttr, data_args: DataArguments) -> Any:
    """The converter the loader used for this dataset, behind the row guard."""
    from llamafactory.data import converter as converter_module

    from ..data.validation import GuardedConverter

    converter = converter_module.get_dataset_converter(dataset_attr.formatting, dataset_attr, data_args)
    return (
        converter if isinstance(converter, GuardedConverter) else GuardedConverter(converter, dataset_attr.formatting)
    )


def stage_checked_datasets(module: ModuleType) -> Any:
    """Datasets are checked for the run's stage, and their rows for the processor that consumes them."""
    from ..data.stages import SUPERVISED, UNSUPERVISED, check_stage_fits, loading_stage
    from ..data.validation import dataset_label

    get_merged_dataset = original(module, "_get_merged_dataset")

    @functools.wraps(get_merged_dataset)
    def zebra_get_merged_dataset(dataset_names, model_args, data_args, training_args, stage, return_dict=False):
        for attr in module.get_dataset_list(dataset_names, data_args.dataset_dir) if dataset_names else ():
            check_stage_fits(attr, stage, dataset_label(attr))
        rows_for = stage
        if stage == SUPERVISED and training_args.predict_with_generate and dataset_names is data_args.eval_dataset:
            rows_for = UNSUPERVISED  # generating reads prompts only (upstream's unsupervised processor)
        with loading_stage(rows_for):
            return get_merged_dataset(dataset_names, model_args, data_args, training_args, stage, return_dict)

    return zebra_get_merged_dataset


def named_row_errors(module: ModuleType) -> Any:
    """Malformed rows and empty files stop the run before tokenisation, named (or malformed rows are
    skipped, counted)."""
    from ..data.row_policy import (
        EmptyDataError,
        MalformedDataError,
        check_converted_rows,
        empty_files_message,
        malformed_rows_message,
    )
    from ..data.validation import MissingColumnError, collecting_drop_reasons

    load_single_dataset = original(module, "_load_single_dataset")

    @functools.wraps(load_single_dataset)
    def zebra_load_single_dataset(dataset_attr, model_args, data_args, training_args):
        if dataset_attr.load_from == "file":
            message = empty_files_message(
                dataset_attr, data_args.dataset_dir, guarded_converter(dataset_attr, data_args)
            )
            if message is not None:
                raise EmptyDataError(message)
        try:
            with collecting_drop_reasons():
                dataset = load_single_dataset(dataset_attr, model_args, data_args, training_args)
        except Exception as err:
            if dataset_attr.load_from != "file" or isinstance(err, (MalformedDataError, MissingColumnError)):
                raise
            converter = guarded_converter(dataset_attr, data_args)
            message = malformed_rows_message(dataset_attr, data_args.dataset_dir, converter, "load")
            if message is None:
                raise
            raise MalformedDataError(message) from err
        converter = guarded_converter(dataset_attr, data_args)
        return check_converted_rows(dataset, dataset_attr, data_args.dataset_dir, converter, module.logger)

    return zebra_load_single_dataset


def truncation_warning(module: ModuleType) -> Any:
    """Supervised rows longer than ``cutoff_len`` are named before tokenisation truncates them."""
    from ..data.cutoff import over_cutoff_message
    from ..data.stages import SUPERVISED

    get_preprocessed_dataset = original(module, "_get_preprocessed_dataset")

    @functools.wraps(get_preprocessed_dataset)
    def zebra_get_preprocessed_dataset(
        dataset, data_args, training_args, stage, template, tokenizer, processor=None, is_eval=False
    ):
        if dataset is not None and stage == SUPERVISED and not data_args.streaming:
            message = over_cutoff_message(dataset, data_args, template, tokenizer)
            if message is not None:
                module.logger.warning_rank0(message)
        return get_preprocessed_dataset(
            dataset, data_args, training_args, stage, template, tokenizer, processor, is_eval
        )

    return zebra_get_preprocessed_dataset


def registry_dataset_dropdown(module: ModuleType) -> Any:
    """The web UI's dataset dropdown lists the user's datasets, then the registry's."""
    load_dataset_info = original(module, "load_dataset_info")

    @functools.wraps(load_dataset_info)
    def zebra_load_dataset_info(dataset_dir):
        if _is_remote(dataset_dir):
            return load_dataset_info(dataset_dir)
        user_info = load_dataset_info(dataset_dir) if os.path.isfile(os.path.join(dataset_dir, DATA_CONFIG)) else {}
        return merge_dataset_info(user_info, os.path.join(dataset_dir, DATA_CONFIG))

    return zebra_load_dataset_info


SEAMS = (
    Seam("llamafactory.data.converter", "register_dataset_converter", ("name", "dataset_converter"),
         register=register_zebra_converters),
    Seam("llamafactory.data.converter", "get_dataset_converter", ("name", "dataset_attr", "data_args"),
         wrapper=guarded_converters),
    Seam("llamafactory.data.parser", "get_dataset_list", ("dataset_names", "dataset_dir"),
         wrapper=registry_dataset_names),
    Seam("llamafactory.data.loader", "_load_single_dataset",
         ("dataset_attr", "model_args", "data_args", "training_args"), wrapper=named_row_errors),
    Seam("llamafactory.data.loader", "_get_merged_dataset",
         ("dataset_names", "model_args", "data_args", "training_args", "stage", "return_dict"),
         wrapper=stage_checked_datasets),
    Seam("llamafactory.data.loader", "_get_preprocessed_dataset",
         ("dataset", "data_args", "training_args", "stage", "template", "tokenizer", "processor", "is_eval"),
         wrapper=truncation_warning),
    Seam("llamafactory.webui.common", "load_dataset_info", ("dataset_dir",), wrapper=registry_dataset_dropdown),
)  # fmt: skip


def install_dataset_seams() -> None:
    """Applies the dataset seams now (idempotent): for ``data inspect`` and processes without the hook.

    Modules that already bound the original names (``from .parser import get_dataset_list`` in
    ``data.loader``) keep them, which is why the hook applies the seams at import time instead.
    """
    for name in dict.fromkeys(seam.module for seam in SEAMS):
        install(SEAMS, importlib.import_module(name), hint=SEAM_HINT)

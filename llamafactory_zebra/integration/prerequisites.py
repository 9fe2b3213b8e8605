"""Packages a run's options need, named before work starts, with the one ``pip install`` that adds them all.

Why: LLaMA-Factory 0.9.5 and transformers find some missing packages only when they reach the code that imports
them: ``report_to``'s logger when the Trainer is built and ``quantization_bit``'s backend when the model
loads, both after the dataset has been loaded and tokenised. ``predict_with_generate`` (LLaMA-Factory's
generation metrics, ``train/sft/metric.py``'s ``ComputeSimilarity``: jieba, nltk, rouge_chinese) is checked by
``llamafactory.hparams.parser._check_extra_dependencies``, but one distribution per run, so a fresh venv fails three
times. The other options LLaMA-Factory needs a package for (``use_unsloth``, ``enable_liger_kernel``,
``mixture_of_depths``, ``use_galore``/``use_apollo``/``use_badam``/``use_adam_mini``, ``use_swanlab``,
``plot_loss``, ``deepspeed``) it checks there too, before anything loads, so they are not repeated here.

:data:`PREREQUISITES` is the table (option → import name → pip requirement). The plugin wraps
``_check_extra_dependencies`` (``get_train_args``, and ``get_infer_args``/``get_eval_args`` without
training arguments): every row whose option the run sets and whose module ``importlib.util.find_spec``
cannot find is named in one ``ValueError`` ending with one ``pip install`` line, before LLaMA-Factory's own
checks, the data or the model. Nothing is imported. The plugin's ``metrics`` extra installs the metrics rows
(``tests/integration/test_prerequisites.py`` holds the extra to the table).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..seam import Seam, original

if TYPE_CHECKING:
    from llamafactory.hparams import ModelArguments, TrainingArguments

Needed = Callable[["ModelArguments", "TrainingArguments | None"], bool]


@dataclass(frozen=True)
class Prerequisite:
    option: str  # the setting that needs the package, as the YAML writes it
    module: str  # the import name the code that needs it imports
    pip: str  # the requirement ``pip install`` takes
    needed: Needed  # whether the run's arguments set the option


def _predicting(model: ModelArguments, training: TrainingArguments | None) -> bool:
    return training is not None and bool(training.predict_with_generate)


def _reporting_to(name: str) -> Needed:
    def needed(model: ModelArguments, training: TrainingArguments | None) -> bool:
        return training is not None and name in (training.report_to or ())

    return needed


def _quantizing_with(method: str) -> Needed:
    """On-the-fly quantisation (``quantization_bit``) with ``quantization_method``'s backend; a checkpoint that
    is already quantised ignores both, so there the row asks for a package the load would not use."""

    def needed(model: ModelArguments, training: TrainingArguments | None) -> bool:
        return model.quantization_bit is not None and model.quantization_method == method

    return needed


PREDICT = "predict_with_generate: true"
QUANTIZING = "quantization_bit with quantization_method:"
PREREQUISITES: tuple[Prerequisite, ...] = (
    Prerequisite(PREDICT, "jieba", "jieba", _predicting),
    Prerequisite(PREDICT, "nltk", "nltk", _predicting),
    Prerequisite(PREDICT, "rouge_chinese", "rouge-chinese", _predicting),
    Prerequisite("report_to: wandb", "wandb", "wandb", _reporting_to("wandb")),
    Prerequisite("report_to: tensorboard", "tensorboard", "tensorboard", _reporting_to("tensorboard")),
    Prerequisite("report_to: mlflow", "mlflow", "mlflow", _reporting_to("mlflow")),
    Prerequisite("report_to: swanlab", "swanlab", "swanlab", _reporting_to("swanlab")),
    Prerequisite("report_to: trackio", "trackio", "trackio", _reporting_to("trackio")),
    Prerequisite("report_to: comet_ml", "comet_ml", "comet-ml", _reporting_to("comet_ml")),
    Prerequisite("report_to: clearml", "clearml", "clearml", _reporting_to("clearml")),
    Prerequisite("report_to: dvclive", "dvclive", "dvclive", _reporting_to("dvclive")),
    Prerequisite(f"{QUANTIZING} bnb", "bitsandbytes", "bitsandbytes", _quantizing_with("bnb")),
    Prerequisite(f"{QUANTIZING} hqq", "hqq", "hqq", _quantizing_with("hqq")),
    Prerequisite(f"{QUANTIZING} eetq", "eetq", "eetq", _quantizing_with("eetq")),
)  # fmt: skip


def missing_prerequisites(model: ModelArguments, training: TrainingArguments | None) -> list[Prerequisite]:
    """The rows the run's options need whose module is not importable here (found, not imported)."""
    return [
        row for row in PREREQUISITES if row.needed(model, training) and importlib.util.find_spec(row.module) is None
    ]


def check_prerequisites(model: ModelArguments, training: TrainingArguments | None) -> None:
    """Raise one ``ValueError`` naming each option, its missing modules, and one ``pip install`` for them all."""
    missing = missing_prerequisites(model, training)
    if not missing:
        return
    by_option: dict[str, list[str]] = {}
    for row in missing:
        by_option.setdefault(row.option, []).append(row.module)
    lines = [f"- {option} needs {', '.join(modules)}" for option, modules in by_option.items()]
    pip = " ".join(dict.fromkeys(row.pip for row in missing))
    raise ValueError(
        "llamafactory-zebra: the run's options need packages that are not installed (found before the data or "
        "the model loads):\n" + "\n".join(lines) + f"\nInstall them: pip install {pip}"
    )


def prerequisites_first(parser: ModuleType) -> Any:
    check_extra_dependencies = original(parser, "_check_extra_dependencies")

    @functools.wraps(check_extra_dependencies)
    def zebra_check_extra_dependencies(model_args, finetuning_args, training_args=None):
        check_prerequisites(model_args, training_args)
        return check_extra_dependencies(model_args, finetuning_args, training_args)

    return zebra_check_extra_dependencies


SEAMS = (
    Seam("llamafactory.hparams.parser", "_check_extra_dependencies",
         ("model_args", "finetuning_args", "training_args"), wrapper=prerequisites_first),
)  # fmt: skip

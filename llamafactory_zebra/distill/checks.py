"""The checks a distillation run passes before any data loads.

The keys themselves (``distill``, ``teacher_model_name_or_path``, ``kd_*``, ``ild_*``) are fields of
``hparams.ZebraArguments``; :func:`check_distill_setup` validates them against the run's LLaMA-Factory
arguments (one ``hparams.TrainingRun``) and both models' configs and tokenizers.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..configuration_zebra import is_zebra_config
from ..hparams import TrainingRun, ZebraArguments

if TYPE_CHECKING:
    from llamafactory.hparams import ModelArguments
    from transformers import PretrainedConfig

# LLaMA-Factory options distillation cannot honour (it replaces the SFT loss and never generates).
UNSUPPORTED_WITH_DISTILL = (
    ("use_asft_loss", "ASFT loss"),
    ("use_dft_loss", "DFT loss"),
    ("use_eaft_loss", "EAFT loss"),
    ("predict_with_generate", "generation"),
)


def check_distill_setup(run: TrainingRun) -> PretrainedConfig:
    """Raise ``ValueError`` naming the key for a run that cannot distil; returns the teacher's config."""
    from transformers import AutoConfig

    distill, model_args, finetuning_args = run.zebra, run.model, run.finetuning

    if finetuning_args.stage != "sft":
        raise ValueError(
            f"distill: {distill.distill} rides on stage: sft (its data path and collator), got stage: "
            f"{finetuning_args.stage}; set stage: sft"
        )
    unsupported = [("sequence_parallel_size", "sequence parallelism")] if distill.sequence_parallel_size > 1 else []
    unsupported += [("tiled_mlp", "tiled_mlp")] if distill.tiled_mlp else []
    unsupported += [(name, what) for name, what in UNSUPPORTED_WITH_DISTILL if getattr(finetuning_args, name, False)]
    if unsupported:
        attribute, what = unsupported[0]
        raise ValueError(f"{attribute} ({what}) is not supported together with distill; remove one of them")
    teacher_path = distill.teacher_model_name_or_path
    if not teacher_path:
        raise ValueError(f"distill: {distill.distill} needs teacher_model_name_or_path (the Transformer teacher)")
    if distill.kd_temperature <= 0:
        raise ValueError(f"kd_temperature must be positive, got {distill.kd_temperature}")
    if distill.kd_kl_weight < 0 or distill.kd_ce_weight < 0:
        raise ValueError(
            f"kd_kl_weight and kd_ce_weight must be >= 0, got {distill.kd_kl_weight}, {distill.kd_ce_weight}"
        )
    if distill.distill == "kd" and distill.kd_kl_weight + distill.kd_ce_weight == 0:
        raise ValueError("kd_kl_weight + kd_ce_weight is 0: the loss would be zero; HyLo uses kd_kl_weight: 1")
    trust = getattr(model_args, "trust_remote_code", False)
    try:
        teacher = AutoConfig.from_pretrained(teacher_path, trust_remote_code=trust)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"teacher_model_name_or_path: {teacher_path} is not a loadable model (no local directory with a "
            f"config.json, nor a hub id reachable from here): {error}"
        ) from None
    student = AutoConfig.from_pretrained(model_args.model_name_or_path, trust_remote_code=trust)
    check_same_vocabulary(teacher_path, teacher, model_args, student)
    if distill.distill == "ild":
        check_ild_shapes(distill, teacher_path, teacher, student)
    return teacher


def check_same_vocabulary(
    teacher_path: str, teacher: PretrainedConfig, model_args: ModelArguments, student: PretrainedConfig
) -> None:
    """Same logit width, and — when the teacher ships a tokenizer — the same token → id map."""
    if teacher.get_text_config().vocab_size != student.get_text_config().vocab_size:
        raise ValueError(
            f"the teacher {teacher_path} has vocab_size {teacher.get_text_config().vocab_size}, the student "
            f"{model_args.model_name_or_path} {student.get_text_config().vocab_size}: distillation compares "
            "next-token distributions, so both must use the same tokenizer"
        )
    if not os.path.isdir(teacher_path) or not any(
        os.path.isfile(os.path.join(teacher_path, name)) for name in ("tokenizer.json", "tokenizer_config.json")
    ):
        return
    from transformers import AutoTokenizer

    trust = getattr(model_args, "trust_remote_code", False)
    teacher_vocab = AutoTokenizer.from_pretrained(teacher_path, trust_remote_code=trust).get_vocab()
    student_vocab = AutoTokenizer.from_pretrained(model_args.model_name_or_path, trust_remote_code=trust).get_vocab()
    if teacher_vocab != student_vocab:
        differing = (
            sorted(t for t in teacher_vocab.keys() ^ student_vocab.keys())[:5]
            or sorted(t for t in teacher_vocab if teacher_vocab[t] != student_vocab[t])[:5]
        )
        raise ValueError(
            f"the tokenizers of the teacher {teacher_path} ({len(teacher_vocab)} tokens) and the student "
            f"{model_args.model_name_or_path} ({len(student_vocab)} tokens) differ (e.g. {differing}): "
            "distillation needs the same tokenizer"
        )


def check_ild_shapes(
    distill: ZebraArguments, teacher_path: str, teacher: PretrainedConfig, student: PretrainedConfig
) -> None:
    if not is_zebra_config(student):
        raise ValueError("distill: ild trains the decoder layers of a Zebra student; the student is not a Zebra model")
    for name in ("hidden_size", "num_hidden_layers"):
        if getattr(teacher, name, None) != getattr(student, name):
            raise ValueError(
                f"distill: ild feeds teacher layer i's input to student layer i, so {name} must match: teacher "
                f"{teacher_path} has {getattr(teacher, name, None)}, the student {getattr(student, name)}"
            )
    bad = [i for i in distill.ild_layers or () if not 0 <= i < student.num_hidden_layers]
    if bad:
        raise ValueError(f"ild_layers {bad} out of range: the student has layers 0..{student.num_hidden_layers - 1}")

"""The distillation keys of a ``llamafactory-cli train`` YAML, and the checks run before any data loads.

LLaMA-Factory's parser rejects keys it does not know, so :func:`pop_distill_args` takes these out of
the arguments first (a YAML dict or ``--key value`` strings) and :func:`check_distill_setup` validates
them against the parsed LLaMA-Factory arguments and both models' configs and tokenizers.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

DISTILL_MODES = ("ild", "kd")
ILD_LOSSES = ("l2", "mse")
ILD_TRAINABLE = ("layers", "mixers")


@dataclasses.dataclass
class DistillArguments:
    """``distill: ild`` (per-layer, teacher-forced) or ``kd`` (end-to-end KL); see docs/distill.md."""

    distill: str
    teacher_model_name_or_path: str | None = None
    kd_kl_weight: float = 1.0
    kd_ce_weight: float = 0.0
    kd_temperature: float = 1.0
    kd_reverse_kl: bool = False
    ild_layers: list[int] | None = None
    ild_loss: str = "l2"
    ild_trainable: str = "layers"
    # Not a YAML key: copied from the student's model arguments for loading the teacher.
    trust_remote_code: bool = dataclasses.field(default=False, metadata={"yaml": False})


FIELDS = {field.name: field for field in dataclasses.fields(DistillArguments) if field.metadata.get("yaml", True)}


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def _as_float(name: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None


def _as_layers(value: Any) -> list[int] | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "all")):
        return None
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, list | tuple) else [value]
    try:
        layers = [int(str(item).strip()) for item in items]
    except ValueError:
        raise ValueError(f"ild_layers must be 'all' or layer indices like 0,3,5, got {value!r}") from None
    if not layers:
        raise ValueError("ild_layers is empty; use 'all' or list layer indices")
    return sorted(set(layers))


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _raw_values(args: dict[str, Any] | list[str]) -> tuple[dict[str, Any] | list[str], dict[str, Any]]:
    if isinstance(args, dict):
        rest = dict(args)
        return rest, {name: rest.pop(name) for name in FIELDS if name in rest}
    rest, raw, items = [], {}, iter(args)
    for item in items:
        name, _, inline = item.lstrip("-").partition("=")
        if item.startswith("--") and name in FIELDS:
            raw[name] = inline if inline else next(items, None)
        else:
            rest.append(item)
    return rest, raw


def pop_distill_args(args: dict[str, Any] | list[str]) -> tuple[dict[str, Any] | list[str], DistillArguments | None]:
    """``args`` without the distillation keys, and those keys parsed (``None`` when ``distill`` is absent)."""
    rest, raw = _raw_values(args)
    if raw.get("distill") in (None, "", "none", False):
        if set(raw) - {"distill"}:
            raise ValueError(f"{', '.join(sorted(set(raw) - {'distill'}))} need distill: ild or distill: kd")
        return rest, None
    parsed = DistillArguments(
        distill=_choice("distill", raw["distill"], DISTILL_MODES),
        teacher_model_name_or_path=raw.get("teacher_model_name_or_path"),
        kd_kl_weight=_as_float("kd_kl_weight", raw.get("kd_kl_weight", 1.0)),
        kd_ce_weight=_as_float("kd_ce_weight", raw.get("kd_ce_weight", 0.0)),
        kd_temperature=_as_float("kd_temperature", raw.get("kd_temperature", 1.0)),
        kd_reverse_kl=_as_bool("kd_reverse_kl", raw.get("kd_reverse_kl", False)),
        ild_layers=_as_layers(raw.get("ild_layers")),
        ild_loss=_choice("ild_loss", raw.get("ild_loss", "l2"), ILD_LOSSES),
        ild_trainable=_choice("ild_trainable", raw.get("ild_trainable", "layers"), ILD_TRAINABLE),
    )
    return rest, parsed


UNSUPPORTED_WITH_DISTILL = (
    ("sequence_parallel_size", "sequence parallelism", lambda v: v > 1),
    ("tiled_mlp", "tiled_mlp", bool),
    ("use_asft_loss", "ASFT loss", bool),
    ("use_dft_loss", "DFT loss", bool),
    ("use_eaft_loss", "EAFT loss", bool),
    ("predict_with_generate", "generation", bool),
)


def check_distill_setup(distill: DistillArguments, model_args: Any, finetuning_args: Any) -> Any:
    """Raise ``ValueError`` naming the key for a run that cannot distil; returns the teacher's config."""
    from transformers import AutoConfig

    if finetuning_args.stage != "sft":
        raise ValueError(
            f"distill: {distill.distill} rides on stage: sft (its data path and collator), got stage: "
            f"{finetuning_args.stage}; set stage: sft"
        )
    for attribute, what, active in UNSUPPORTED_WITH_DISTILL:
        if active(getattr(finetuning_args, attribute, None) or 0):
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


def check_same_vocabulary(teacher_path: str, teacher: Any, model_args: Any, student: Any) -> None:
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


def check_ild_shapes(distill: DistillArguments, teacher_path: str, teacher: Any, student: Any) -> None:
    if getattr(student, "model_type", None) != "zebra":
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

"""Turn a LLaMA-Factory training YAML into a ``TrainingSetup``, the way LLaMA-Factory itself reads it.

The file is read and parsed by ``hparams.read_run_arguments`` (as ``llamafactory.hparams.parser.read_args`` reads it):
the plugin's keys (``sequence_parallel_size``) into ``hparams.ZebraArguments`` and the rest into LLaMA-Factory's own
dataclasses, so defaults and validation are LLaMA-Factory's and the plugin's own. ``TrainingArguments`` is the
exception: its ``__post_init__`` checks the
*current* machine (bf16 needs a GPU, DeepSpeed initialises accelerate), and the plan is usually made on
another one; its few fields that matter are read from the YAML with the dataclass's defaults.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from ..attention_policy import PLANNER_ATTENTION, attn_implementation_for
from ..configuration_zebra import ZebraConfig
from ..hparams import read_run_arguments
from ..presets import preset_name
from ..released import checkpoint_layout, load_checkpoint_config
from .memory_plan import TrainingSetup


def resolve_model_config(name_or_path: str) -> tuple[ZebraConfig, str]:
    """A Zebra config from a local checkpoint (native or released layout), a preset name or a known hub id."""
    if os.path.isdir(name_or_path):
        if checkpoint_layout(name_or_path) is None:
            raise ValueError(
                f"model_name_or_path {name_or_path}: not a Zebra checkpoint (expected a config.json with "
                f"model_type {ZebraConfig.model_type!r}, or AMD's layout with a hybrid_config.json)"
            )
        return load_checkpoint_config(name_or_path), name_or_path
    try:
        preset = preset_name(name_or_path)
    except ValueError as error:
        raise ValueError(
            f"model_name_or_path {name_or_path!r} is neither a local directory nor a known Zebra model; use a "
            f"checkpoint directory or a preset name: {error}"
        ) from None
    where = f"preset {preset}" if preset == name_or_path else f"{name_or_path} (preset {preset})"
    return ZebraConfig.from_preset(preset), where


def _training_field(values: dict[str, Any], name: str) -> Any:
    """A ``TrainingArguments`` value from the YAML, else the dataclass default (no ``__post_init__``)."""
    if name in values:
        return values[name]
    from llamafactory.hparams import TrainingArguments

    default = {f.name: f for f in dataclasses.fields(TrainingArguments)}[name]
    return default.default_factory() if default.default_factory is not dataclasses.MISSING else default.default


def _deepspeed_setup(value: Any, yaml_dir: Path, hidden_size: int) -> dict[str, Any]:
    if value is None:
        return {"zero_stage": None, "deepspeed_label": "none"}
    if isinstance(value, dict):
        ds, label = value, "inline dict"
    else:
        candidates = [Path(value), yaml_dir / value]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            raise ValueError(f"deepspeed: {value} not found (looked in {', '.join(map(str, candidates))})")
        with open(found, encoding="utf-8") as f:
            ds, label = json.load(f), str(value)
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum

    # HF fills these "auto" sizes from the hidden size (trainer_config_finalize); DeepSpeed's own config
    # class supplies the defaults of absent keys and validates the rest.
    h2 = hidden_size * hidden_size
    auto = {
        "reduce_bucket_size": h2,
        "stage3_prefetch_bucket_size": int(0.9 * h2),
        "stage3_param_persistence_threshold": 10 * hidden_size,
    }
    zero_values = {k: auto.get(k, v) if v == "auto" else v for k, v in ds.get("zero_optimization", {}).items()}
    zero = DeepSpeedZeroConfig(**zero_values)

    def offloaded(offload) -> bool:
        return offload is not None and offload.device != OffloadDeviceEnum.none

    stage = int(zero.stage)
    gather = {2: zero.allgather_bucket_size, 3: zero.prefetch_bucket_size}.get(stage, 0)
    return {
        "zero_stage": stage,
        "offload_optimizer": offloaded(zero.offload_optimizer),
        "offload_params": offloaded(zero.offload_param),
        "reduce_bucket_elements": int(zero.reduce_bucket_size) if stage >= 2 else 0,
        "gather_bucket_elements": int(gather),
        "deepspeed_label": label,
    }


def setup_from_yaml(
    path: str | os.PathLike,
    gpus: int,
    gpu_memory: float,
    gpu_label: str,
    sequence_parallel: int | None = None,
) -> TrainingSetup:
    values, run = read_run_arguments(path, parse_training=False)
    model_args, data_args, finetuning_args, zebra = run.model, run.data, run.finetuning, run.zebra
    if model_args.model_name_or_path is None:
        raise ValueError(f"{path}: model_name_or_path is missing")
    config, label = resolve_model_config(model_args.model_name_or_path)
    try:
        attention = attn_implementation_for(model_args.flash_attn)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    if attention not in PLANNER_ATTENTION:
        raise ValueError(
            f"{path}: flash_attn {model_args.flash_attn!s} ({attention} attention) keeps a T×T score matrix per "
            f"head; the planner models {', '.join(PLANNER_ATTENTION)} only"
        )
    if finetuning_args.pure_bf16:
        precision = "pure_bf16"
    elif _training_field(values, "bf16"):
        precision = "bf16"
    elif _training_field(values, "fp16"):
        precision = "fp16"
    else:
        precision = "fp32"
    return TrainingSetup(
        config=config,
        model_label=label,
        cutoff_len=int(data_args.cutoff_len),
        micro_batch=int(_training_field(values, "per_device_train_batch_size")),
        gpus=gpus,
        gpu_memory=gpu_memory,
        gpu_label=gpu_label,
        sequence_parallel=int(sequence_parallel or zebra.sequence_parallel_size),
        precision=precision,
        finetuning_type=finetuning_args.finetuning_type,
        lora_rank=finetuning_args.lora_rank,
        lora_target=tuple(finetuning_args.lora_target),
        additional_target=tuple(finetuning_args.additional_target or ()),
        freeze_trainable_layers=finetuning_args.freeze_trainable_layers,
        freeze_trainable_modules=tuple(finetuning_args.freeze_trainable_modules),
        freeze_extra_modules=tuple(finetuning_args.freeze_extra_modules or ()),
        gradient_checkpointing=not model_args.disable_gradient_checkpointing,
        checkpoints_on_cpu=bool(model_args.use_unsloth_gc),
        fused_cross_entropy=bool(model_args.enable_liger_kernel),
        attention=attention,
        packing=bool(data_args.packing) or bool(data_args.neat_packing),
        **_deepspeed_setup(_training_field(values, "deepspeed"), Path(path).parent, config.hidden_size),
    )

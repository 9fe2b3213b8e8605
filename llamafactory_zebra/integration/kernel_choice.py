"""Kernel resolution at LLaMA-Factory's entry points: before a Zebra model loads, say which kernels it gets.

For a Zebra model (a local checkpoint or one of AMD's released hub ids), ``get_train_args``
(``llamafactory-cli train``, distillation, the web UI's training runs) resolves for training
(``training.py``, before the guard rails) and raises on a known-broken combination, so the run stops
before the model or the data load, with the fixes as the last lines. ``get_infer_args`` (``chat``,
``api``, ``export``, the web UI's chat, ``llamafactory-zebra eval-long``) is wrapped here to resolve for
inference: forward only, so a backward-only problem does not apply; it only logs. Both resolve for the
dtype the run computes in (``bf16``/``pure_bf16`` for training, ``infer_dtype`` for inference), so a bf16
run on a CPU without bf16 dot products is named with its fix before the model loads. The table is logged
once per process at info level and each warning once (``kernels.emit_once``, shared with the ops). A
training run also gets the workarounds the plugin applies itself before anything compiles (a Triton
cache directory per rank on ROCm: ``kernels/workarounds.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from ..attention_policy import attn_implementation_for
from ..hparams import TrainingRun
from ..kernels import STOP, WARN, Resolution, detect_stack, emit_once, resolve
from ..kernels.known_issues import TRITON_CACHE_SHARED
from ..kernels.workarounds import triton_cache_per_rank
from ..presets import PRESET_HUB_IDS
from ..released import checkpoint_layout
from ..seam import Seam, original

if TYPE_CHECKING:
    from llamafactory.hparams import FinetuningArguments, ModelArguments, TrainingArguments


def is_zebra_model(model_name_or_path: str | None) -> bool:
    """A local Zebra checkpoint (either layout) or one of AMD's released hub ids (not downloaded yet)."""
    return bool(checkpoint_layout(model_name_or_path)) or model_name_or_path in PRESET_HUB_IDS.values()


def training_dtype(training_args: TrainingArguments, finetuning_args: FinetuningArguments) -> torch.dtype:
    """The dtype LLaMA-Factory trains in: bf16 with ``bf16`` or ``pure_bf16``, fp16 with ``fp16``, else fp32."""
    if training_args.bf16 or finetuning_args.pure_bf16:
        return torch.bfloat16
    return torch.float16 if training_args.fp16 else torch.float32


def inference_dtype(model_args: ModelArguments, on_gpu: bool) -> torch.dtype:
    """The dtype LLaMA-Factory infers in: ``infer_dtype``; ``auto`` is bf16 on a GPU and fp32 on a CPU, where
    LLaMA-Factory finds no bf16 (``extras.misc.infer_optim_dtype``)."""
    name = model_args.infer_dtype
    if name == "auto":
        return torch.bfloat16 if on_gpu else torch.float32
    return getattr(torch, name)


def resolve_for_run(
    model_args: ModelArguments, *, training: bool, use_cpu: bool = False, dtype: torch.dtype | None = None
) -> Resolution:
    """The kernels this run's model will use, from its LLaMA-Factory arguments and this machine; ``dtype``:
    what it computes in (None: ``infer_dtype``'s, for inference); the model's arguments only:
    ``get_infer_args`` has no training run."""
    stack = detect_stack()
    stack = stack.on_cpu() if use_cpu else stack
    return resolve(
        stack,
        training=training,
        attn_implementation=attn_implementation_for(model_args.flash_attn),
        liger_enabled=bool(getattr(model_args, "enable_liger_kernel", False)),
        dtype=dtype or inference_dtype(model_args, stack.has_gpu),
    )


def log_resolution(resolution: Resolution, info: Callable[[str], None], warning: Callable[[str], None]) -> None:
    """Log the table once and each warning once; raise with the fixes last when training must not start."""
    emit_once(f"kernel table {resolution.phase}", f"llamafactory-zebra: {resolution.table(fixes=False)}", info)
    for problem in resolution.with_severity(WARN):
        emit_once(problem.key or problem.message, f"llamafactory-zebra: {problem.message}", warning)
    if resolution.with_severity(STOP):
        raise ValueError(resolution.stop_message())


def training_kernel_step(run: TrainingRun) -> None:
    """For a Zebra model: resolve the kernels for training, log them, stop on a known-broken combination, and
    apply the workarounds the plugin makes itself."""
    model_args, logger = run.model, run.logger
    if not is_zebra_model(model_args.model_name_or_path):
        return
    resolution = resolve_for_run(
        model_args,
        training=True,
        use_cpu=bool(run.training.use_cpu),
        dtype=training_dtype(run.training, run.finetuning),
    )
    log_resolution(resolution, logger.info_rank0, logger.warning_rank0)
    if any(p.key == TRITON_CACHE_SHARED for p in resolution.problems):
        directory = triton_cache_per_rank(resolution.stack)
        if directory is not None:
            logger.info_rank0(f"llamafactory-zebra: Triton cache of this rank: {directory} ({TRITON_CACHE_SHARED})")


def inference_kernel_table(parser: ModuleType) -> Any:
    get_infer_args = original(parser, "get_infer_args")

    @functools.wraps(get_infer_args)
    def zebra_get_infer_args(args=None):
        parsed = get_infer_args(args)
        model_args = parsed[0]
        if is_zebra_model(model_args.model_name_or_path):
            log_resolution(
                resolve_for_run(model_args, training=False), parser.logger.info_rank0, parser.logger.warning_rank0
            )
        return parsed

    return zebra_get_infer_args


SEAMS = (Seam("llamafactory.hparams.parser", "get_infer_args", ("args",), wrapper=inference_kernel_table),)

"""Checks at training start for Zebra runs: refuse what is known to break, warn about what silently hurts.

LLaMA-Factory validates arguments generically; these are the traps specific to this model family and
its AMD recipe (see docs/rocm.md and docs/deepspeed.md):

* fp16 on ROCm: the recipe trains in bf16 only; fp16's 5-bit exponent overflows (NaN losses), so it
  is refused with the fix, not warned about.
* a ``warmup_ratio`` at long context: packing 1M-token sequences leaves a few hundred optimizer steps
  or fewer, and a ratio of that is a handful of warmup steps (the seed recipe uses ``warmup_steps: 200``).
* ZeRO-3 without ``stage3_gather_16bit_weights_on_model_save``: the saved model holds empty tensors.
* the YAML and the DeepSpeed JSON disagree (precision, batch sizes, clipping, optimizer/scheduler
  values; see ``config_conflicts.py``): refused here, not after the dataset is tokenised.
* ``flash_attn: fa3``: LLaMA-Factory 0.9.5 raises "Unknown attention type" only when it loads the model,
  after the data (the refused values and why: ``attention_policy.py``); ``fa2`` asked for on a GPU
  without flash-attn falls back to SDPA with a warning only.
* fp32 on a GPU: nothing fails, but the run needs twice the activation memory of the bf16 recipe.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..attention_policy import LLAMAFACTORY_FA2, SDPA, attn_implementation_for, flash_attn_value
from ..configuration_zebra import is_zebra_config
from ..hparams import TrainingRun, data_parallel_size, optimizer_steps_per_epoch, total_optimizer_steps
from ..kernels import packed_attention, this_machine
from .config_conflicts import check_deepspeed_conflicts, deepspeed_warnings

if TYPE_CHECKING:
    from llamafactory.hparams import ModelArguments, TrainingArguments

_SAVE_KEYS = (
    "stage3_gather_16bit_weights_on_model_save",
    "gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save",
)
# Fewer warmup steps than this from a ratio is almost no warmup for a length-extended model.
MIN_WARMUP_STEPS = 10


def running_on_rocm() -> bool:
    return this_machine().rocm_build


def keep_packing_masks_2d(run: TrainingRun) -> None:
    """For a Zebra checkpoint, ``block_diag_attn`` off: the model keeps packed samples apart itself (the
    samples' borders reach every attention kernel), so LLaMA-Factory's 4-D neat-packing mask, O(L²) per row,
    is never built for the non-FlashAttention backends."""
    if run.config is not None:
        run.model.block_diag_attn = False


def guard_step(run: TrainingRun) -> None:
    """For a Zebra checkpoint: the setups that must not start raise; the others are logged as warnings."""
    if run.config is None:
        return
    for warning in check_training_setup(run):
        run.logger.warning_rank0(f"llamafactory-zebra: {warning}")


def check_training_setup(
    run: TrainingRun, *, num_train_examples: int | None = None, is_rocm: bool | None = None
) -> list[str]:
    """Warnings for a Zebra training run; raises ``ValueError`` for setups that must not start.

    ``num_train_examples`` (the length of the training dataset after packing, when known) lets the warmup
    check count optimizer steps as the HF Trainer will; without it only ``max_steps`` is used. ``is_rocm``
    overrides the detection (a ROCm build of torch, ``kernels.this_machine``; for tests). Messages name the
    YAML (``run.source``).
    """
    if not is_zebra_config(run.config):
        return []
    rocm = running_on_rocm() if is_rocm is None else is_rocm
    deepspeed = deepspeed_config(run.training)
    _refuse_fp16_on_rocm(run.training, deepspeed, rocm)
    check_deepspeed_conflicts(run)
    _refuse_unsupported_attention(run.model)
    warnings = deepspeed_warnings(run)
    warnings += _accelerator_warnings(run.model, run.training, run.source)
    warmup = _warmup_warning(run, num_train_examples)
    if warmup:
        warnings.append(warmup)
    save = _zero3_save_warning(deepspeed)
    if save:
        warnings.append(save)
    return warnings


def deepspeed_config(training_args: TrainingArguments) -> dict[str, Any] | None:
    """The DeepSpeed config as the Trainer will use it (already loaded by ``TrainingArguments``) or ``None``."""
    hf_config = getattr(training_args, "hf_deepspeed_config", None)
    if hf_config is not None:
        return hf_config.config
    value = getattr(training_args, "deepspeed", None)
    if value is None or isinstance(value, dict):
        return value
    with open(value, encoding="utf-8") as f:
        return json.load(f)


def _refuse_fp16_on_rocm(training_args: TrainingArguments, deepspeed: dict[str, Any] | None, rocm: bool) -> None:
    if not rocm:
        return
    ds_fp16 = bool(deepspeed) and (deepspeed.get("fp16") or {}).get("enabled") is True
    if getattr(training_args, "fp16", False) or getattr(training_args, "fp16_full_eval", False) or ds_fp16:
        source = "the DeepSpeed config's fp16.enabled" if ds_fp16 else "fp16: true"
        raise ValueError(
            f"Zebra on ROCm trains in bf16 only, but {source} asks for fp16: its narrow exponent range "
            "overflows in long-context training (NaN loss). Set `bf16: true`, remove `fp16`, and use a "
            "deepspeed_configs/*_bf16.json preset (see docs/rocm.md)."
        )


def _refuse_unsupported_attention(model_args: ModelArguments) -> None:
    attn_implementation_for(model_args.flash_attn)  # raises for a refused value, with the reason


def _accelerator_warnings(model_args: ModelArguments, training_args: TrainingArguments, arguments: str) -> list[str]:
    if training_args.use_cpu or not this_machine().has_gpu:
        return []
    warnings = []
    if not (training_args.bf16 or training_args.fp16 or training_args.bf16_full_eval):
        warnings.append(
            f"{arguments} trains in fp32 on a GPU (no `bf16: true`): twice the activation memory and far slower "
            "matmuls than the bf16 recipe; add `bf16: true` unless fp32 is what you want."
        )
    attention = flash_attn_value(model_args.flash_attn)
    from transformers.utils import is_flash_attn_2_available

    if attention == LLAMAFACTORY_FA2 and not is_flash_attn_2_available():
        kernel = packed_attention(SDPA, "cuda").key
        warnings.append(
            f"flash_attn: fa2 in {arguments} but flash-attn is not installed: LLaMA-Factory falls back to SDPA, "
            f"which runs packed rows on {kernel} (docs/architecture.md#packed-sequences); install flash-attn "
            "for FlashAttention-2's varlen kernel (ROCm: the CK build, see docs/rocm.md)."
        )
    return warnings


def optimizer_steps(
    training_args: TrainingArguments, num_train_examples: int | None, sequence_parallel: int = 1
) -> int | None:
    """Optimizer steps the Trainer will run (``hparams/optimizer_steps.py``), or ``None`` if unknowable.

    Sequence-parallel ranks share a batch, so only the data-parallel ranks
    (``hparams.data_parallel_size``) read different batches.
    """
    if training_args.max_steps <= 0 and not num_train_examples:
        return None
    per_epoch = optimizer_steps_per_epoch(
        num_train_examples or 0,
        training_args.per_device_train_batch_size,
        training_args.gradient_accumulation_steps,
        data_parallel_size(training_args.world_size, sequence_parallel),
        training_args.dataloader_drop_last,
    )
    return total_optimizer_steps(per_epoch, training_args.num_train_epochs, training_args.max_steps)


def _warmup_warning(run: TrainingRun, num_train_examples: int | None) -> str | None:
    training_args = run.training
    ratio = training_args.warmup_steps  # transformers >= 5 stores warmup_ratio here as a float < 1
    if not 0 < ratio < 1:
        return None
    steps = optimizer_steps(training_args, num_train_examples, run.zebra.sequence_parallel_size)
    if steps is None:
        return None
    warmup = training_args.get_warmup_steps(steps)
    if warmup >= MIN_WARMUP_STEPS:
        return None
    return (
        f"warmup_ratio {ratio} gives {warmup} warmup step(s) of {steps} at cutoff_len {run.data.cutoff_len}: "
        f"long packed sequences leave few optimizer steps, so a ratio barely warms up. Set an absolute "
        f"`warmup_steps` (at least {MIN_WARMUP_STEPS}; AMD's 1M recipe used 200) and drop `warmup_ratio`."
    )


def _zero3_save_warning(deepspeed: dict[str, Any] | None) -> str | None:
    if not deepspeed or "zero_optimization" not in deepspeed:
        return None
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    # DeepSpeed's own parser resolves the key's aliases and deprecated spelling; the other keys may
    # still hold HF's "auto" at training start, which it would reject, so only these are passed.
    keys = {"stage", *_SAVE_KEYS}
    zero = DeepSpeedZeroConfig(**{k: v for k, v in deepspeed["zero_optimization"].items() if k in keys})
    if zero.stage != 3 or zero.gather_16bit_weights_on_model_save:
        return None
    return (
        "DeepSpeed ZeRO-3 without stage3_gather_16bit_weights_on_model_save: the saved model.safetensors will "
        "hold empty (partitioned) tensors and only the DeepSpeed checkpoint can restore the weights. Set it to "
        "true, or use deepspeed_configs/ds_z3_bf16.json."
    )

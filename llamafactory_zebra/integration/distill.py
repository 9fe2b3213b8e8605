"""``distill: ild | kd`` in ``llamafactory-cli train`` (see docs/distill.md): the steps ``training.py``'s
seams call, and the one wrapper distillation adds on its own.

- ``hparams.parser.get_train_args`` (``training.py``'s one wrapper): the distillation keys leave the
  arguments with the plugin's other keys before LLaMA-Factory parses them (``hparams.ZebraArguments``,
  stored on ``finetuning_args``) and are checked (stage, teacher path, vocabulary, weights, ILD shapes,
  no SP / tiled MLP) before any data is loaded (:func:`distill_step`); with FlashAttention, the teacher's
  FA function is registered there (``registrations.register_sinkless_flash_attention``).
- ``train.sft.workflow.CustomSeq2SeqTrainer`` (wrapped in ``training.py``): ``run_sft`` builds
  ``distill.trainer.DistillTrainer`` when ``distill`` is set.
- ``train.callbacks.LogCallback.on_log``, during distillation only: LLaMA-Factory writes a fixed set of
  keys to ``trainer_log.jsonl``; the wrapper adds the distillation metrics of the same log entry.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from ..attention_policy import FLASH_ATTENTION_BACKENDS, attn_implementation_for
from ..distill.checks import check_distill_setup
from ..distill.metrics import METRIC_PREFIXES
from ..hparams import TrainingRun, ZebraArguments
from ..seam import Seam, install, original, wrapped_method
from . import SEAM_HINT
from .registrations import register_sinkless_flash_attention


def distill_step(run: TrainingRun) -> None:
    """Check the distillation keys when ``distill`` is set, and keep the student's ``trust_remote_code`` for
    loading the teacher."""
    distill = run.zebra
    if not distill.distilling:
        return
    check_distill_setup(run)
    if attn_implementation_for(run.model.flash_attn) in FLASH_ATTENTION_BACKENDS:
        register_sinkless_flash_attention()
    distill.trust_remote_code = bool(run.model.trust_remote_code)
    from llamafactory.train import callbacks

    install(SEAMS, callbacks, only=("LogCallback.on_log",), hint=SEAM_HINT)
    run.logger.info_rank0(f"llamafactory-zebra: {describe(distill)}")


def describe(distill: ZebraArguments) -> str:
    if distill.distill == "kd":
        direction = "reverse KL(student||teacher)" if distill.kd_reverse_kl else "forward KL(teacher||student)"
        return (
            f"distill: kd, {direction} at T={distill.kd_temperature}, loss = {distill.kd_kl_weight} x KD + "
            f"{distill.kd_ce_weight} x CE, teacher {distill.teacher_model_name_or_path}"
        )
    layers = "all" if distill.ild_layers is None else distill.ild_layers
    return (
        f"distill: ild ({distill.ild_loss}) on layers {layers}, training the {distill.ild_trainable}, teacher "
        f"{distill.teacher_model_name_or_path}"
    )


def distill_metrics_in_the_log(callbacks: ModuleType) -> Any:
    """Add the distillation metrics of the newest ``log_history`` entry to the line LogCallback writes."""
    on_log = original(callbacks, "LogCallback.on_log")
    write_log = original(callbacks, "LogCallback._write_log")

    @functools.wraps(on_log)
    def on_log_with_distill_metrics(self, args, state, control, **kwargs):
        latest = state.log_history[-1] if state.log_history else {}
        extra = {k: v for k, v in latest.items() if k.startswith(METRIC_PREFIXES)}
        if not extra:
            return on_log(self, args, state, control, **kwargs)

        @functools.wraps(self._write_log)
        def write_log_with_distill_metrics(output_dir, logs):
            return write_log(self, output_dir, {**logs, **extra})

        with wrapped_method(WRITE_LOG, self, write_log_with_distill_metrics, SEAM_HINT):
            return on_log(self, args, state, control, **kwargs)

    return on_log_with_distill_metrics


WRITE_LOG = Seam("llamafactory.train.callbacks", "LogCallback._write_log", ("self", "output_dir", "logs"))
SEAMS = (
    Seam("llamafactory.train.callbacks", "LogCallback.on_log", ("self", "args", "state", "control"),
         wrapper=distill_metrics_in_the_log, on_import=False),
    WRITE_LOG,
)  # fmt: skip

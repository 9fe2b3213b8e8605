"""``distill: ild | kd`` in ``llamafactory-cli train`` (see docs/distill.md); two seams:

- ``hparams.parser.get_train_args``: the distillation keys leave the arguments before LLaMA-Factory
  parses them, are checked (stage, teacher path, vocabulary, weights, ILD shapes) before any data is
  loaded, and are stored as ``finetuning_args.distill``.
- ``train.sft.workflow.CustomSeq2SeqTrainer``: ``run_sft`` builds :func:`distill.trainer.distill_trainer`'s
  subclass of LLaMA-Factory's trainer when ``finetuning_args.distill`` is set (patched when the parser
  sees the keys: by then ``llamafactory.train.tuner`` has imported the workflow).

Plus, during distillation only, ``train.callbacks.LogCallback.on_log``: LLaMA-Factory writes a fixed set of
keys to ``trainer_log.jsonl``; the wrapper adds the distillation metrics of the same log entry.
"""

from __future__ import annotations

import functools
from types import ModuleType

from ..distill.args import DistillArguments, check_distill_setup, pop_distill_args
from ..distill.trainer import METRIC_PREFIXES, distill_trainer
from .seams import upstream


def patch_parser(parser: ModuleType) -> None:
    """Wrapper of ``get_train_args`` outside the sequence-parallel one (so SP/tiled-MLP keys are parsed)."""
    get_train_args = upstream(parser, "get_train_args")
    read_args = upstream(parser, "read_args")

    @functools.wraps(get_train_args)
    def get_train_args_with_distill(args=None):
        args, distill = pop_distill_args(read_args(args))
        parsed = get_train_args(args)
        model_args, _, _, finetuning_args, _ = parsed
        finetuning_args.distill = distill
        if distill is not None:
            check_distill_setup(distill, model_args, finetuning_args)
            distill.trust_remote_code = bool(model_args.trust_remote_code)
            from llamafactory.train import callbacks
            from llamafactory.train.sft import workflow

            patch_sft_workflow(workflow)
            patch_log_callback(callbacks)
            parser.logger.info_rank0(f"llamafactory-zebra: {describe(distill)}")
        return parsed

    parser.get_train_args = get_train_args_with_distill


def describe(distill: DistillArguments) -> str:
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


def patch_sft_workflow(workflow: ModuleType) -> None:
    """Make ``run_sft`` build the distillation trainer when ``finetuning_args.distill`` is set (idempotent)."""
    if getattr(workflow.CustomSeq2SeqTrainer, "distill_base", None) is not None:
        return
    upstream(workflow, "CustomSeq2SeqTrainer.__init__")
    base = workflow.CustomSeq2SeqTrainer
    trainer_class = distill_trainer(base)

    @functools.wraps(base, updated=())
    def trainer_for_run(*args, **kwargs):
        if getattr(kwargs.get("finetuning_args"), "distill", None) is not None:
            return trainer_class(*args, **kwargs)
        return base(*args, **kwargs)

    trainer_for_run.distill_base = base
    workflow.CustomSeq2SeqTrainer = trainer_for_run


def patch_log_callback(callbacks: ModuleType) -> None:
    """Add the distillation metrics of the newest ``log_history`` entry to the line LogCallback writes."""
    log_callback = callbacks.LogCallback
    on_log = upstream(callbacks, "LogCallback.on_log")
    if getattr(on_log, "distill_metrics", False):
        return
    write_log = upstream(callbacks, "LogCallback._write_log")

    @functools.wraps(on_log)
    def on_log_with_distill_metrics(self, args, state, control, **kwargs):
        latest = state.log_history[-1] if state.log_history else {}
        extra = {k: v for k, v in latest.items() if k.startswith(METRIC_PREFIXES)}
        if not extra:
            return on_log(self, args, state, control, **kwargs)
        self._write_log = lambda output_dir, logs: write_log(self, output_dir, {**logs, **extra})
        try:
            return on_log(self, args, state, control, **kwargs)
        finally:
            del self._write_log

    on_log_with_distill_metrics.distill_metrics = True
    log_callback.on_log = on_log_with_distill_metrics

"""LLaMA-Factory's SFT trainer with a distillation loss (``distill: ild | kd``); everything else is SFT's.

The loss is computed inside the student's own forward (``ZebraForCausalLM``'s ``head_loss_fn``), so the
student still goes through its DDP / DeepSpeed / PEFT wrappers exactly as in SFT: ZeRO-3 gathers the
student's weights (lm_head included) as usual and DDP sees one graph. Only ``compute_loss`` and ``log``
change:

- ``kd``: the teacher's final hidden states (no logits) come from a ``no_grad`` forward of its decoder;
  the student's final hidden states and lm_head meet them in :func:`kd_loss.kd_loss_sums`, divided by the
  Trainer's ``num_items_in_batch`` — token-weighted across gradient accumulation and ranks like SFT's CE.
- ``ild``: see ``ild.py``. The loss is a per-micro-batch mean (as AMD's), so the trainer declares that its
  model does not take loss kwargs and the HF Trainer divides by the accumulation steps itself (its own
  documented switch for custom losses).
- ``log``: ``kd_loss``, ``ce_loss`` (student cross-entropy on the labels, per target token) or
  ``ild_loss_{i}`` per layer, averaged over the logging window and all ranks, join ``loss`` in
  ``log_history`` (hence ``trainer_state.json``, ``trainer_log.jsonl`` and the loss plots). They are
  summed on the device and read once per log (``metrics.LossParts``), as the Trainer does with its loss.

``training.py``'s wrapper of the SFT workflow's ``CustomSeq2SeqTrainer`` builds :class:`DistillTrainer`
when ``distill`` is set; LLaMA-Factory's trainer is imported here, so this module is imported only then.
"""

from __future__ import annotations

from typing import Any

import torch
from llamafactory.train.sft.trainer import CustomSeq2SeqTrainer

from ..attention_policy import FLASH_ATTENTION_BACKENDS, distill_teacher_attention
from ..configuration_zebra import is_zebra_config
from ..hparams import ZebraArguments, zebra_arguments
from ..kernels import Call, Op, select
from ..loss import IGNORE_INDEX, shifted_targets
from .ild import LayerHooks, decoder_layers, ild_layer_losses, teacher_layer_states
from .kd_loss import kd_loss_sums
from .metrics import METRIC_PREFIXES, MICRO_BATCHES, TOKENS, LossParts
from .teacher import load_teacher, teacher_inputs


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def freeze_outside_ild(model: torch.nn.Module, distill: ZebraArguments) -> int:
    """Stop training what ILD gives no signal to (embeddings, final norm, lm_head, layers not in
    ``ild_layers``, and with ``ild_trainable: mixers`` the MLPs and norms). Returns how many tensors froze.

    Besides saving optimizer memory, this keeps DDP from waiting for gradients that never come."""
    layers = range(len(decoder_layers(model))) if distill.ild_layers is None else distill.ild_layers
    prefixes = tuple(f"layers.{i}." for i in layers)
    frozen = 0
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        inside = any(f".{prefix}" in f".{name}" for prefix in prefixes)
        if inside and distill.ild_trainable == "mixers":
            inside = ".mla." in name or ".gdn." in name
        if not inside:
            parameter.requires_grad_(False)
            frozen += 1
    return frozen


class DistillTrainer(CustomSeq2SeqTrainer):
    """LLaMA-Factory's SFT trainer with the loss of ``distill: kd | ild`` (see the module doc)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.distill: ZebraArguments = zebra_arguments(self.finetuning_args)
        student = _unwrapped(self.model)
        if not is_zebra_config(student.config):
            raise ValueError("distillation is implemented for Zebra students (the loss runs in their forward)")
        attention = distill_teacher_attention(getattr(student.config, "_attn_implementation", None))
        self.teacher_flash_attention = attention in FLASH_ATTENTION_BACKENDS
        dtype = torch.bfloat16 if self.args.bf16 else torch.float16 if self.args.fp16 else torch.float32
        self.teacher = load_teacher(
            self.distill.teacher_model_name_or_path,
            device=self.args.device,
            dtype=dtype,
            attn_implementation=attention,
            trust_remote_code=self.distill.trust_remote_code,
            hf_deepspeed_config=getattr(self.args, "hf_deepspeed_config", None),
        )
        self.loss_parts = LossParts()
        if self.distill.distill == "ild":
            self.model_accepts_loss_kwargs = False
            frozen = freeze_outside_ild(student, self.distill)
            self.teacher_forcing: LayerHooks | None = None
            self._log(f"ILD: {frozen} parameter tensors frozen (no ILD signal reaches them)")
            if getattr(student, "is_gradient_checkpointing", False):
                # Reentrant checkpointing runs the first forward without a graph, which would cut the
                # mixer-output term; non-reentrant recomputes one layer at a time in backward.
                student.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self._log(
            f"distill: {self.distill.distill} from {self.distill.teacher_model_name_or_path} "
            f"(teacher replicated on each rank, {dtype}, frozen; KD on this device: "
            f"{select(Op.DISTILLATION_LOSS, Call.on(self.args.device.type)).kernel.key})"
        )

    def _log(self, message: str) -> None:
        from llamafactory.extras import logging

        logging.get_logger("llamafactory.zebra").info_rank0(f"llamafactory-zebra: {message}")

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        batch_inputs, real_tokens = teacher_inputs(inputs, self.teacher.dtype, self.teacher_flash_attention)
        if self.distill.distill == "ild":
            return self._ild_loss(model, inputs, batch_inputs, real_tokens, return_outputs)
        return self._kd_loss(model, inputs, batch_inputs, labels, return_outputs, num_items_in_batch)

    def _kd_loss(self, model, inputs, batch_inputs, labels, return_outputs, num_items_in_batch):
        with torch.no_grad():
            teacher_hidden = self.teacher.get_decoder()(**batch_inputs, use_cache=False).last_hidden_state
        teacher_weight = self.teacher.get_output_embeddings().weight
        targets = shifted_targets(labels, inputs.pop("shift_labels", None)).reshape(-1)
        distill, parts = self.distill, self.loss_parts

        def head_loss(hidden: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
            total, kd, ce = kd_loss_sums(
                hidden.reshape(-1, hidden.shape[-1]),
                lm_head_weight,
                teacher_hidden.reshape(-1, teacher_hidden.shape[-1]),
                teacher_weight,
                targets.to(hidden.device),
                temperature=distill.kd_temperature,
                reverse=distill.kd_reverse_kl,
                kl_weight=distill.kd_kl_weight,
                ce_weight=distill.kd_ce_weight,
            )
            count = (targets != IGNORE_INDEX).sum()
            parts.add("kd_loss", kd)
            if ce is not None:
                parts.add("ce_loss", ce)
            parts.add(TOKENS, count)
            denominator = num_items_in_batch if num_items_in_batch is not None else count.clamp_min(1)
            if torch.is_tensor(denominator):
                denominator = denominator.to(total.device)
            return total / denominator

        inputs["head_loss_fn"] = head_loss
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _ild_loss(self, model, inputs, batch_inputs, real_tokens, return_outputs):
        teacher = teacher_layer_states(self.teacher, **batch_inputs)
        layers = list(range(len(teacher.outputs))) if self.distill.ild_layers is None else self.distill.ild_layers
        if self.teacher_forcing is None:
            # Installed once (a checkpointed layer re-runs in backward and must get the same teacher input),
            # at the first step: after DeepSpeed's ZeRO-3 hooks, so the outputs recorded are the ones its
            # backward hooks are attached to.
            student = _unwrapped(self.accelerator.unwrap_model(model))
            self.teacher_forcing = LayerHooks(decoder_layers(student), record_inputs=False)
        recorded = self.teacher_forcing.start(teacher)
        parts = self.loss_parts

        def head_loss(hidden: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
            losses = ild_layer_losses(recorded, teacher, layers, real_tokens, self.distill.ild_loss)
            for index, value in losses.items():
                parts.add(f"ild_loss_{index}", value)
            parts.add(MICRO_BATCHES, torch.ones((), device=hidden.device))
            return torch.stack(list(losses.values())).sum()

        inputs["head_loss_fn"] = head_loss
        return super().compute_loss(model, inputs, return_outputs)

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        try:
            return super().training_step(*args, **kwargs)
        finally:
            if self.distill.distill == "ild" and self.teacher_forcing is not None:
                self.teacher_forcing.stop()  # after backward: drop this step's teacher states

    def save_state(self) -> None:
        """After SFT's own ``training_loss.png``, one plot per distillation metric (``plot_loss: true``)."""
        super().save_state()
        if self.is_world_process_zero() and self.finetuning_args.plot_loss:
            from llamafactory.extras.ploting import plot_loss

            keys = sorted({k for entry in self.state.log_history for k in entry if k.startswith(METRIC_PREFIXES)})
            plot_loss(self.args.output_dir, keys=keys)

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs and self.loss_parts:
            logs.update(self.loss_parts.take(self.accelerator, self.args.device))
        super().log(logs, *args, **kwargs)

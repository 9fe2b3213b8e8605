"""The sequence-parallel SFT trainer: LLaMA-Factory's ``CustomSeq2SeqTrainer`` with each batch split over
the ranks of a sequence-parallel group (``sequence_parallel.py``'s module docstring says what changes and
through which seams).

``training.py``'s wrapper of the SFT workflow's ``CustomSeq2SeqTrainer`` builds :class:`SequenceParallelTrainer`
when ``sequence_parallel_size > 1``; LLaMA-Factory's trainer is imported here, so this module is imported
only then (as ``distill.trainer`` is).
"""

from __future__ import annotations

import functools

from llamafactory.train.sft.trainer import CustomSeq2SeqTrainer

from ..hparams import zebra_arguments
from ..parallel import enable_sequence_parallel, layout_from_deepspeed, new_layout, shard_batch
from ..seam import wrapped_method
from . import SEAM_HINT
from .sequence_parallel import ACCELERATOR_PREPARE, deepspeed_initialize_with_mpu, prepare_data_parallel_loader


class SequenceParallelTrainer(CustomSeq2SeqTrainer):
    """LLaMA-Factory's SFT trainer on one shard of each row per rank, with whole-row token weighting."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        sp = zebra_arguments(self.finetuning_args).sequence_parallel_size
        if self.is_deepspeed_enabled:
            self.sp_layout, self.sp_mpu = layout_from_deepspeed(sp)
        else:
            self.sp_layout, self.sp_mpu = new_layout(sp), None
        enable_sequence_parallel(self.model, self.sp_layout)
        # Zebra's forward takes num_items_in_batch and shift_labels: the token weighting must reach it.
        self.model_accepts_loss_kwargs = True
        self.sp_pad_token_id = getattr(self.processing_class, "pad_token_id", None) or 0

    def get_train_dataloader(self):
        """The Trainer's own dataloader, prepared for data-parallel ranks: its ``accelerator.prepare``
        call (``Trainer._get_dataloader``) is this trainer's only one during this method."""
        accelerator, layout = self.accelerator, self.sp_layout

        @functools.wraps(accelerator.prepare)
        def prepare_per_data_parallel_rank(dataloader):
            return prepare_data_parallel_loader(accelerator, dataloader, layout.dp_size, layout.dp_rank)

        with wrapped_method(ACCELERATOR_PREPARE, accelerator, prepare_per_data_parallel_rank, SEAM_HINT):
            return super().get_train_dataloader()

    def _get_num_items_in_batch(self, batch_samples, device):
        """Target tokens of the whole rows; every SP rank counted them, so the gathered sum is ``sp`` times
        the data-parallel total."""
        count = super()._get_num_items_in_batch(batch_samples, device)
        return count / self.sp_layout.size if count is not None else None

    def _prepare_inputs(self, inputs):
        inputs = super()._prepare_inputs(inputs)
        shard = shard_batch(inputs, self.sp_layout, pad_token_id=self.sp_pad_token_id)
        shard.pop("num_items_in_batch", None)
        return shard

    def train(self, *args, **kwargs):
        if self.sp_mpu is None:
            return super().train(*args, **kwargs)
        with deepspeed_initialize_with_mpu(self.sp_mpu, self.sp_layout.dp_size):
            return super().train(*args, **kwargs)

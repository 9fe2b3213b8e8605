"""``sequence_parallel_size: N`` for Zebra in ``llamafactory-cli train`` (SFT; full, LoRA, freeze).

LLaMA-Factory 0.9.5 has no such key (its parser rejects unknown keys) and transformers' own ALST
wiring needs accelerate >= 1.12, which LLaMA-Factory pins out. So the plugin adds it at these seams:

- ``launcher.launch`` (``launcher.py``): a size that does not divide ``NNODES x NPROC_PER_NODE`` is
  refused in the launching process, before torchrun starts a worker.
- ``hparams.parser.get_train_args`` (``training.py`` calls the steps here): the key leaves the arguments
  with the plugin's other keys before LLaMA-Factory parses them (``hparams.ZebraArguments``), and the
  setup is checked (world size, attention backend, head count, ``cutoff_len``, unsupported options)
  before any data is loaded.
- ``train.sft.workflow.CustomSeq2SeqTrainer`` (wrapped in ``training.py``): with SP > 1 the SFT
  workflow builds ``sequence_parallel_trainer.SequenceParallelTrainer``, a subclass of LLaMA-Factory's
  trainer, instead (in its own module, imported only then, as the distillation trainer is: importing
  LLaMA-Factory's trainer while its argument parser loads would be circular and slow every command).
- ``accelerate.Accelerator.prepare``, on that trainer's accelerator while it builds the training
  dataloader only (``seam.wrapped_method``): the loader is sharded over data-parallel ranks.
- ``deepspeed.initialize`` (looked up by accelerate at call time), during ``train()`` only: DeepSpeed
  gets ALST's ``parallel_state_sp`` as ``mpu`` and ``train_batch_size = micro x accumulation x dp``
  (HF's "auto" fill counts every rank as data parallel).

The trainer loads batches per data-parallel rank (accelerate's own ``prepare_data_loader`` with
``dp`` processes, so all ranks of an SP group read the same batch, in the order a ``dp``-process run
would), cuts each batch into this rank's shard with shifted labels (``parallel.shard_batch``), and
divides the Trainer's token count by SP so the loss stays token-weighted over the group (see
``parallel/sharding.py`` for why that gives exact gradients under DeepSpeed's and DDP's averaging).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from ..attention_policy import flash_attn_value, sequence_parallel_accepts_flash_attn
from ..configuration_zebra import is_zebra_config
from ..hparams import TrainingRun, check_sequence_parallel_size, data_parallel_size
from ..seam import Seam, original, wrapped
from . import SEAM_HINT

UNSUPPORTED_WITH_SP = (
    ("predict_with_generate", "generation"),
    ("compute_accuracy", "token accuracy (needs whole-row logits)"),
    ("use_dft_loss", "DFT loss"),
    ("use_eaft_loss", "EAFT loss"),
    ("use_asft_loss", "ASFT loss"),
    ("do_eval", "evaluation"),
    ("do_predict", "prediction"),
)


def sequence_parallel_step(run: TrainingRun) -> None:
    """With ``sequence_parallel_size > 1``: the setup is checked and the split logged."""
    sp = run.zebra.sequence_parallel_size
    if sp > 1:
        check_sequence_parallel_setup(run)
        run.logger.info_rank0(
            f"llamafactory-zebra: sequence parallelism {sp} x data parallelism "
            f"{data_parallel_size(run.training.world_size, sp)}"
        )


def check_sequence_parallel_setup(run: TrainingRun) -> None:
    """Raise ``ValueError`` for a run SP cannot do exactly; called before any data is loaded."""
    sp, config = run.zebra.sequence_parallel_size, run.config
    model_args, data_args, training_args, finetuning_args = run.model, run.data, run.training, run.finetuning
    if not is_zebra_config(config):
        raise ValueError(
            f"sequence_parallel_size is implemented by llamafactory-zebra for Zebra models only; "
            f"{model_args.model_name_or_path} is {getattr(config, 'model_type', None)!r}"
        )
    check_sequence_parallel_size(sp, training_args.world_size)
    if finetuning_args.stage != "sft":
        raise ValueError(f"sequence_parallel_size supports stage: sft, got stage: {finetuning_args.stage}")
    attention = flash_attn_value(model_args.flash_attn)
    if not sequence_parallel_accepts_flash_attn(attention):
        raise ValueError(
            f"flash_attn: {attention} (eager attention) cannot run under sequence_parallel_size: it materialises "
            f"whole-row attention weights per head; use flash_attn: fa2 on GPUs (packed samples via position_ids) or "
            f"sdpa (packed samples via their borders, docs/architecture.md#packed-sequences)"
        )
    if config.num_attention_heads % sp:
        raise ValueError(
            f"sequence_parallel_size={sp} must divide the MLA query heads ({config.num_attention_heads}): Ulysses "
            f"gives each rank whole heads"
        )
    # LLaMA-Factory keeps packed rows one token short of the YAML's cutoff_len and pads them back.
    cutoff_len = data_args.cutoff_len + int(bool(data_args.packing))
    if cutoff_len % sp:
        raise ValueError(
            f"cutoff_len={cutoff_len} must be a multiple of sequence_parallel_size={sp} so a full packed row splits "
            f"into equal shards without padding; use e.g. cutoff_len: {cutoff_len - cutoff_len % sp + sp}"
        )
    for attribute, what in UNSUPPORTED_WITH_SP:
        owner = next((a for a in (training_args, finetuning_args) if getattr(a, attribute, False)), None)
        if owner is not None:
            raise ValueError(f"{attribute}: true ({what}) is not supported with sequence_parallel_size > 1; remove it")


def prepare_data_parallel_loader(accelerator: Any, dataloader: Any, dp_size: int, dp_rank: int) -> Any:
    """``Accelerator.prepare_data_loader`` with ``dp`` processes instead of all ranks: every rank of an SP
    group gets the same batches (accelerate's sampler, seeding, epoch and resume handling unchanged)."""
    from accelerate.data_loader import prepare_data_loader

    prepared = prepare_data_loader(
        dataloader,
        accelerator.device,
        num_processes=dp_size,
        process_index=dp_rank,
        split_batches=accelerator.split_batches,
        put_on_device=accelerator.device_placement,
        rng_types=accelerator.rng_types.copy(),
        dispatch_batches=accelerator.dispatch_batches,
        even_batches=accelerator.even_batches,
        use_seedable_sampler=accelerator.use_seedable_sampler,
        data_seed=accelerator.dataloader_config.data_seed,
        non_blocking=accelerator.non_blocking,
        use_stateful_dataloader=accelerator.use_stateful_dataloader,
    )
    accelerator._dataloaders.append(prepared)
    return prepared


def deepspeed_config_for_sequence_parallel(config: dict[str, Any], dp_size: int) -> dict[str, Any]:
    """DeepSpeed's rule under SP: ``train_batch_size = micro x accumulation x dp`` (not x world)."""
    config = dict(config)
    micro, accumulation = config.get("train_micro_batch_size_per_gpu"), config.get("gradient_accumulation_steps")
    if isinstance(micro, int) and isinstance(accumulation, int):
        config["train_batch_size"] = micro * accumulation * dp_size
    return config


@contextlib.contextmanager
def deepspeed_initialize_with_mpu(mpu: ModuleType, dp_size: int) -> Iterator[None]:
    import deepspeed

    initialize = original(deepspeed, "initialize")

    @functools.wraps(initialize)
    def initialize_with_mpu(*args, **kwargs):
        for key in ("config_params", "config"):
            if isinstance(kwargs.get(key), dict):
                kwargs[key] = deepspeed_config_for_sequence_parallel(kwargs[key], dp_size)
        kwargs["mpu"] = mpu
        return initialize(*args, **kwargs)

    with wrapped(DEEPSPEED_INITIALIZE, deepspeed, initialize_with_mpu, SEAM_HINT):
        yield


DEEPSPEED_INITIALIZE = Seam(
    "deepspeed",
    "initialize",
    ("args", "model", "optimizer", "model_parameters", "training_data", "lr_scheduler", "distributed_port", "mpu"),
    on_import=False,
)
# Accelerate's ``prepare`` of one object, during an SP run (``sequence_parallel_trainer.py``).
ACCELERATOR_PREPARE = Seam("accelerate.accelerator", "Accelerator.prepare", ("self", "args"), on_import=False)
SEAMS = (DEEPSPEED_INITIALIZE, ACCELERATOR_PREPARE)

"""The training-run seams: one wrapper of ``get_train_args``, one of the SFT workflow's trainer class.

``hparams.parser.get_train_args`` is where every plugin key and check meets LLaMA-Factory's parser. Its
wrapper takes the plugin's own keys out of the arguments (``sequence_parallel_size``, ``tiled_mlp``, the
``distill`` keys: LLaMA-Factory's parser rejects unknown keys) into ``hparams.ZebraArguments``, lets
LLaMA-Factory parse the rest, and hands one :class:`~..hparams.TrainingRun` (its five dataclasses and the
plugin's keys as one ``hparams.RunArguments``, the checkpoint's Zebra config, where the arguments came from)
to every step of :data:`TRAINING_STEPS`, in order, before any data is loaded. The table says what each step
does and why; each lives with its feature.

When SP, tiled MLP or distillation is on, ``train.sft.workflow``'s ``CustomSeq2SeqTrainer`` is wrapped (once
per process; by then ``llamafactory.train.tuner`` has imported the workflow) so the run gets tiled MLPs and/or
the sequence-parallel or distillation trainer.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from ..hparams import (
    RunArguments,
    TrainingRun,
    ZebraArguments,
    pop_zebra_arguments,
    store_zebra_arguments,
    zebra_arguments,
)
from ..released import checkpoint_layout, load_checkpoint_config
from ..seam import Seam, install, original
from . import SEAM_HINT
from .config_conflicts import arguments_source
from .distill import distill_step
from .guards import guard_step, keep_packing_masks_2d
from .kernel_choice import training_kernel_step
from .resume import resume_step
from .sequence_parallel import sequence_parallel_step
from .steps import Step, run_steps
from .tiled_mlp import tile_mlps, tiled_mlp_step


def store_plugin_keys(run: TrainingRun) -> None:
    store_zebra_arguments(run.finetuning, run.zebra)


def trainer_wrapper_step(run: TrainingRun) -> None:
    if needs_trainer_wrapper(run.zebra):
        from llamafactory.train.sft import workflow

        install(SEAMS, workflow, only=("CustomSeq2SeqTrainer",), hint=SEAM_HINT)


TRAINING_STEPS: tuple[Step, ...] = (
    Step("plugin keys", store_plugin_keys,
         "the trainer wrapper and the workers read the plugin's keys from finetuning_args, the one object "
         "LLaMA-Factory hands them", overrides="finetuning_args (an added attribute)"),
    Step("sequence parallelism", sequence_parallel_step,
         "world size, attention backend, heads and cutoff_len must allow an exact Ulysses split"),
    Step("tiled MLP", tiled_mlp_step, "Zebra models only, and DeepSpeed or a single process"),
    Step("distillation", distill_step, "stage, teacher, vocabulary, weights and ILD shapes; no SP or tiled MLP"),
    Step("kernels", training_kernel_step,
         "a known-broken kernel/Triton/GPU combination stops the run here, before the model loads, with the fixes"),
    Step("2-D packing masks", keep_packing_masks_2d,
         "the Zebra model keeps packed samples apart itself, so LLaMA-Factory's O(L^2) 4-D neat-packing mask for "
         "non-FlashAttention backends is not built", overrides="model_args.block_diag_attn"),
    Step("guard rails", guard_step,
         "fp16 on ROCm, DeepSpeed conflicts, attention backends, warmup and ZeRO-3 saves, named with the YAML"),
    Step("resume", resume_step,
         "a checkpoint a crash left half-written is never resumed from: the last complete one is",
         overrides="training_args.resume_from_checkpoint"),
    Step("trainer", trainer_wrapper_step, "SP, tiled MLP and distillation need their trainer"),
)  # fmt: skip


def plugin_keys_and_checks(parser: ModuleType) -> Any:
    get_train_args = original(parser, "get_train_args")
    read_args = original(parser, "read_args")

    @functools.wraps(get_train_args)
    def zebra_get_train_args(args=None):
        source = arguments_source(args)
        args, zebra = pop_zebra_arguments(read_args(args))
        arguments = RunArguments.from_llamafactory(get_train_args(args), zebra)
        path = arguments.model.model_name_or_path
        config = load_checkpoint_config(path) if checkpoint_layout(path) else None
        run_steps(TRAINING_STEPS, TrainingRun(arguments, config, source, parser.logger))
        return arguments.llamafactory_tuple()

    return zebra_get_train_args


def needs_trainer_wrapper(zebra: ZebraArguments) -> bool:
    return zebra.sequence_parallel_size > 1 or zebra.tiled_mlp or zebra.distilling


def trainer_for_the_run(workflow: ModuleType) -> Any:
    """``run_sft`` builds its trainer through this wrapper: tiled MLPs when ``tiled_mlp``, the distillation
    trainer when ``distill`` is set, the sequence-parallel subclass when ``sequence_parallel_size > 1``
    (distillation refuses SP at parse time)."""
    from ..distill.trainer import DistillTrainer
    from .sequence_parallel_trainer import SequenceParallelTrainer

    base = original(workflow, "CustomSeq2SeqTrainer")

    @functools.wraps(base, updated=())
    def trainer_for_run(*args, **kwargs):
        zebra = zebra_arguments(kwargs.get("finetuning_args"))
        if zebra.tiled_mlp:
            tile_mlps(kwargs["model"], workflow.logger)
        if zebra.distilling:
            return DistillTrainer(*args, **kwargs)
        if zebra.sequence_parallel_size > 1:
            return SequenceParallelTrainer(*args, **kwargs)
        return base(*args, **kwargs)

    return trainer_for_run


SEAMS = (
    Seam("llamafactory.hparams.parser", "get_train_args", ("args",), wrapper=plugin_keys_and_checks),
    Seam("llamafactory.hparams.parser", "read_args", ("args",)),
    Seam("llamafactory.train.sft.workflow", "CustomSeq2SeqTrainer",
         ("finetuning_args", "processor", "model_args", "gen_kwargs"), wrapper=trainer_for_the_run, on_import=False),
)  # fmt: skip

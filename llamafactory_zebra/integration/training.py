"""The training-run seams: one wrapper of ``get_train_args``, one of the SFT workflow's trainer class.

``hparams.parser.get_train_args`` is where every plugin key and check meets LLaMA-Factory's parser.
One wrapper runs the steps in this order (each step lives with its feature):

1. the plugin's own keys leave the arguments and are parsed into ``hparams.ZebraArguments``
   (``sequence_parallel_size``, ``tiled_mlp``, the ``distill`` keys): LLaMA-Factory's parser rejects
   unknown keys;
2. LLaMA-Factory parses the rest; its five dataclasses and the plugin's keys travel on as one
   ``hparams.RunArguments`` (fields by name), and the plugin's keys are stored on ``finetuning_args``;
3. sequence parallelism: the setup is checked (world size, attention backend, heads, ``cutoff_len``)
   — ``sequence_parallel.py``;
4. tiled MLP: the setup is checked — ``tiled_mlp.py``;
5. distillation: the settings are checked (it refuses SP and tiled MLP) — ``distill.py``;
6. kernels, for Zebra models (local or AMD's hub ids): resolved for training (``kernel_choice.py``);
   a known-broken kernel/Triton/GPU combination stops the run here, before the model loads, with the
   fixes as the last lines;
7. guard rails, for Zebra checkpoints: neat-packing masks stay 2-D (the model isolates samples itself,
   so the O(L²) 4-D mask LLaMA-Factory builds for non-FA2 backends is not needed), then
   ``guards.check_training_setup`` — which reads the stored keys, and names the YAML file (or the
   command line) the arguments came from — then ``resume_from_last_complete_checkpoint`` points
   ``resume_from_checkpoint`` at a complete save (``resume.py``).

All of it runs before any data is loaded. When SP, tiled MLP or distillation is on, ``train.sft.workflow``'s
``CustomSeq2SeqTrainer`` is wrapped (once per process; by then ``llamafactory.train.tuner`` has
imported the workflow) so the run gets tiled MLPs and/or the sequence-parallel or distillation trainer.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from ..configuration_zebra import ZebraConfig
from ..hparams import (
    RunArguments,
    ZebraArguments,
    data_parallel_size,
    pop_zebra_arguments,
    store_zebra_arguments,
    zebra_arguments,
)
from ..released import checkpoint_layout, load_checkpoint_config
from ..seam import Seam, install, original
from . import SEAM_HINT
from .config_conflicts import arguments_source
from .distill import distill_step
from .guards import check_training_setup
from .kernel_choice import training_kernel_step
from .resume import resume_from_last_complete_checkpoint
from .sequence_parallel import check_sequence_parallel_setup
from .tiled_mlp import check_tiled_mlp_setup, tile_mlps


def sequence_parallel_step(run: RunArguments, config: ZebraConfig | None, logger: Any) -> None:
    sp = run.zebra.sequence_parallel_size
    if sp > 1:
        check_sequence_parallel_setup(sp, run.model, run.data, run.training, run.finetuning, config)
        logger.info_rank0(
            f"llamafactory-zebra: sequence parallelism {sp} x data parallelism "
            f"{data_parallel_size(run.training.world_size, sp)}"
        )


def tiled_mlp_step(run: RunArguments) -> None:
    if run.zebra.tiled_mlp:
        check_tiled_mlp_setup(run.model, run.training)


def guard_step(run: RunArguments, config: ZebraConfig | None, arguments: str, logger: Any) -> None:
    if config is None:
        return
    run.model.block_diag_attn = False
    for warning in check_training_setup(
        run.model, run.data, run.training, run.finetuning, config, arguments=arguments
    ):
        logger.warning_rank0(f"llamafactory-zebra: {warning}")
    resume_from_last_complete_checkpoint(run.training, logger)


def plugin_keys_and_checks(parser: ModuleType) -> Any:
    get_train_args = original(parser, "get_train_args")
    read_args = original(parser, "read_args")

    @functools.wraps(get_train_args)
    def zebra_get_train_args(args=None):
        arguments = arguments_source(args)
        args, zebra = pop_zebra_arguments(read_args(args))
        run = RunArguments.from_llamafactory(get_train_args(args), zebra)
        store_zebra_arguments(run.finetuning, zebra)
        path = run.model.model_name_or_path
        config = load_checkpoint_config(path) if checkpoint_layout(path) else None
        sequence_parallel_step(run, config, parser.logger)
        tiled_mlp_step(run)
        distill_step(run, parser.logger)
        training_kernel_step(run.model, run.training, parser.logger)
        guard_step(run, config, arguments, parser.logger)
        if needs_trainer_wrapper(zebra):
            from llamafactory.train.sft import workflow

            install(SEAMS, workflow, only=("CustomSeq2SeqTrainer",), hint=SEAM_HINT)
        return run.llamafactory_tuple()

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

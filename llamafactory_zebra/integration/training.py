"""The training-run seams: one wrapper of ``get_train_args``, one of the SFT workflow's trainer class.

``hparams.parser.get_train_args`` is where every plugin key and check meets LLaMA-Factory's parser.
One wrapper runs the steps in this order (each step lives with its feature):

1. the plugin's own keys leave the arguments and are parsed into ``hparams.ZebraArguments``
   (``sequence_parallel_size``, ``tiled_mlp``, the ``distill`` keys): LLaMA-Factory's parser rejects
   unknown keys;
2. LLaMA-Factory parses the rest, and the plugin's keys are stored on ``finetuning_args``;
3. sequence parallelism: the setup is checked (world size, attention backend, heads, ``cutoff_len``)
   — ``sequence_parallel.py``;
4. tiled MLP: the setup is checked — ``tiled_mlp.py``;
4b. distillation: the settings are checked (it refuses SP and tiled MLP) — ``distill.py``;
5. kernels, for Zebra models (local or AMD's hub ids): resolved for training (``kernel_choice.py``);
   a known-broken kernel/Triton/GPU combination stops the run here, before the model loads, with the
   fixes as the last lines;
6. guard rails, for Zebra checkpoints: neat-packing masks stay 2-D (the model isolates samples itself,
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
from ..hparams import ZebraArguments, pop_zebra_arguments, store_zebra_arguments, zebra_arguments
from ..released import checkpoint_layout, load_checkpoint_config
from .config_conflicts import arguments_source
from .distill import distill_step
from .guards import check_training_setup
from .kernel_choice import training_kernel_step
from .resume import resume_from_last_complete_checkpoint
from .seams import is_wrapped, upstream, wrap
from .sequence_parallel import check_sequence_parallel_setup, sequence_parallel_trainer
from .tiled_mlp import check_tiled_mlp_setup, tile_mlps

TrainArgs = tuple[Any, Any, Any, Any, Any]


def sequence_parallel_step(sp: int, parsed: TrainArgs, config: ZebraConfig | None, logger: Any) -> None:
    model_args, data_args, training_args, finetuning_args, _ = parsed
    if sp > 1:
        check_sequence_parallel_setup(sp, model_args, data_args, training_args, finetuning_args, config)
        logger.info_rank0(
            f"llamafactory-zebra: sequence parallelism {sp} x data parallelism {training_args.world_size // sp}"
        )


def tiled_mlp_step(tiled: bool, parsed: TrainArgs) -> None:
    model_args, _, training_args, _, _ = parsed
    if tiled:
        check_tiled_mlp_setup(model_args, training_args)


def guard_step(parsed: TrainArgs, config: ZebraConfig | None, arguments: str, logger: Any) -> None:
    if config is None:
        return
    model_args, data_args, training_args, finetuning_args, _ = parsed
    model_args.block_diag_attn = False
    for warning in check_training_setup(
        model_args, data_args, training_args, finetuning_args, config, arguments=arguments
    ):
        logger.warning_rank0(f"llamafactory-zebra: {warning}")
    resume_from_last_complete_checkpoint(training_args, logger)


def on_parser_loaded(parser: ModuleType) -> None:
    get_train_args = upstream(parser, "get_train_args")
    read_args = upstream(parser, "read_args")

    @functools.wraps(get_train_args)
    def zebra_get_train_args(args=None):
        arguments = arguments_source(args)
        args, zebra = pop_zebra_arguments(read_args(args))
        parsed = get_train_args(args)
        store_zebra_arguments(parsed[3], zebra)
        path = parsed[0].model_name_or_path
        config = load_checkpoint_config(path) if checkpoint_layout(path) else None
        sequence_parallel_step(zebra.sequence_parallel_size, parsed, config, parser.logger)
        tiled_mlp_step(zebra.tiled_mlp, parsed)
        distill_step(zebra, parsed, parser.logger)
        training_kernel_step(parsed[0], parsed[2], parser.logger)
        guard_step(parsed, config, arguments, parser.logger)
        if needs_trainer_wrapper(zebra):
            from llamafactory.train.sft import workflow

            patch_sft_workflow(workflow)
        return parsed

    wrap(parser, "get_train_args", zebra_get_train_args)


def needs_trainer_wrapper(zebra: ZebraArguments) -> bool:
    return zebra.sequence_parallel_size > 1 or zebra.tiled_mlp or zebra.distilling


def patch_sft_workflow(workflow: ModuleType) -> None:
    """``run_sft`` builds its trainer through this wrapper: tiled MLPs when ``tiled_mlp``, the distillation
    trainer when ``distill`` is set, the sequence-parallel subclass when ``sequence_parallel_size > 1``
    (idempotent; distillation refuses SP at parse time)."""
    if is_wrapped(workflow, "CustomSeq2SeqTrainer"):
        return
    from ..distill.trainer import DistillTrainer

    base = upstream(workflow, "CustomSeq2SeqTrainer")
    sp_trainer = sequence_parallel_trainer(base)

    @functools.wraps(base, updated=())
    def trainer_for_run(*args, **kwargs):
        zebra = zebra_arguments(kwargs.get("finetuning_args"))
        if zebra.tiled_mlp:
            tile_mlps(kwargs["model"], workflow.logger)
        if zebra.distilling:
            return DistillTrainer(*args, **kwargs)
        if zebra.sequence_parallel_size > 1:
            return sp_trainer(*args, **kwargs)
        return base(*args, **kwargs)

    wrap(workflow, "CustomSeq2SeqTrainer", trainer_for_run)

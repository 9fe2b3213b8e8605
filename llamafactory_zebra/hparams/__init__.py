"""What the plugin reads from a training run's arguments, like LLaMA-Factory's own ``hparams/``.

- ``zebra_args``: the plugin's YAML keys (:class:`ZebraArguments`), parsed once with ``HfArgumentParser``.
- ``run_arguments``: a run's parsed arguments, LLaMA-Factory's and the plugin's, by name (:class:`RunArguments`).
- ``training_run``: one training run as the plugin's checks see it (:class:`TrainingRun`).
- ``training_yaml``: the one reader of a training YAML for the plugin's tools (``plan``, ``data inspect``).
- ``optimizer_steps``: optimizer steps of a run, as accelerate and the Trainer will count them.
- ``parallel_sizes``: the sequence- and data-parallel size rules.
"""

from .optimizer_steps import batches_per_rank, optimizer_steps_per_epoch, total_optimizer_steps
from .parallel_sizes import check_sequence_parallel_size, data_parallel_size
from .run_arguments import RunArguments
from .training_run import TrainingRun
from .training_yaml import read_run_arguments, read_training_yaml
from .zebra_args import ZebraArguments, pop_zebra_arguments, store_zebra_arguments, zebra_arguments

__all__ = [
    "RunArguments",
    "TrainingRun",
    "ZebraArguments",
    "batches_per_rank",
    "check_sequence_parallel_size",
    "data_parallel_size",
    "optimizer_steps_per_epoch",
    "pop_zebra_arguments",
    "read_run_arguments",
    "read_training_yaml",
    "store_zebra_arguments",
    "total_optimizer_steps",
    "zebra_arguments",
]

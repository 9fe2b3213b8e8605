"""A ``hparams.TrainingRun`` from the argument objects a test builds (real dataclasses or namespaces)."""

from llamafactory_zebra.hparams import RunArguments, TrainingRun, ZebraArguments


def training_run(
    model=None, data=None, training=None, finetuning=None, *, config=None, zebra=None, source="t.yaml", logger=None
) -> TrainingRun:
    arguments = RunArguments(model, data, training, finetuning, None, zebra or ZebraArguments())
    return TrainingRun(arguments, config, source, logger)

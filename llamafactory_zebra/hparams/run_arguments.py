"""A training run's parsed arguments as one named, typed value: LLaMA-Factory's five dataclasses and the
plugin's :class:`ZebraArguments`.

``llamafactory.hparams.get_train_args`` returns a bare 5-tuple; the plugin's steps read fields by name
from :class:`RunArguments` instead of by position, and :meth:`RunArguments.llamafactory_tuple` hands
LLaMA-Factory back exactly the tuple it produced. It is built in one place (``integration/training.py``'s
wrapper of ``get_train_args``); the tools build it from a YAML with ``training_yaml.read_run_arguments``.
LLaMA-Factory is imported for type checking only: this module is a low floor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .zebra_args import ZebraArguments

if TYPE_CHECKING:
    from llamafactory.hparams import (
        DataArguments,
        FinetuningArguments,
        GeneratingArguments,
        ModelArguments,
        TrainingArguments,
    )


@dataclass(frozen=True)
class RunArguments:
    model: ModelArguments
    data: DataArguments
    training: TrainingArguments | None
    """``None`` only where :func:`parse_run_arguments` was asked not to parse it (the planner)."""
    finetuning: FinetuningArguments
    generating: GeneratingArguments
    zebra: ZebraArguments

    @classmethod
    def from_llamafactory(cls, parsed: tuple, zebra: ZebraArguments) -> RunArguments:
        """From ``get_train_args``' ``(model, data, training, finetuning, generating)`` and the plugin's keys."""
        model, data, training, finetuning, generating = parsed
        return cls(model, data, training, finetuning, generating, zebra)

    def llamafactory_tuple(self) -> tuple:
        """``(model, data, training, finetuning, generating)``, as ``get_train_args`` returns them."""
        return self.model, self.data, self.training, self.finetuning, self.generating


def parse_run_arguments(values: dict[str, Any], parse_training: bool = True) -> RunArguments:
    """The dataclasses from a YAML's values, the plugin's keys taken out first, parsed by transformers'
    ``HfArgumentParser`` as LLaMA-Factory parses them; keys of other plugins are tolerated.

    ``parse_training=False`` leaves ``training`` as ``None``: ``TrainingArguments.__post_init__`` checks the
    current machine (bf16 needs a GPU, DeepSpeed initialises accelerate), which a plan made for another
    machine must not run.
    """
    from llamafactory.hparams import (
        DataArguments,
        FinetuningArguments,
        GeneratingArguments,
        ModelArguments,
        TrainingArguments,
    )
    from transformers import HfArgumentParser

    from .zebra_args import pop_zebra_arguments

    rest, zebra = pop_zebra_arguments(dict(values))
    classes = [ModelArguments, DataArguments, TrainingArguments, FinetuningArguments, GeneratingArguments]
    if not parse_training:
        classes.remove(TrainingArguments)
    parsed = list(HfArgumentParser(classes).parse_dict(rest, allow_extra_keys=True))
    if not parse_training:
        parsed.insert(2, None)
    return RunArguments.from_llamafactory(tuple(parsed), zebra)

"""The plugin's own keys in a ``llamafactory-cli train`` YAML, parsed once, the way LLaMA-Factory parses its own.

LLaMA-Factory 0.9.5's parser rejects keys it does not know, so :func:`pop_zebra_arguments` takes these
out of the arguments (a YAML mapping or ``--key value`` strings) before LLaMA-Factory sees them and
parses them with transformers' ``HfArgumentParser`` into :class:`ZebraArguments`, through the same two
paths LLaMA-Factory uses for its dataclasses: ``parse_dict`` for a mapping, ``parse_args_into_dataclasses``
for strings. The training wrapper stores the result on ``finetuning_args`` (:func:`store_zebra_arguments`);
the guards, ``data inspect``, ``plan`` and the trainers read it back with :func:`zebra_arguments`.

Adding a key is adding a field here: its name is the YAML key, its default the only default, its
``help`` what ``--help`` and the docs say.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .parallel_sizes import check_sequence_parallel_size

if TYPE_CHECKING:
    from llamafactory.hparams import FinetuningArguments

DISTILL_MODES = ("ild", "kd")
ILD_LOSSES = ("l2", "mse")
ILD_TRAINABLE = ("layers", "mixers")
# The attribute of LLaMA-Factory's ``FinetuningArguments`` that carries the parsed keys through the run.
STORED_ON = "zebra"


def layer_indices(value: Any) -> list[int] | None:
    """``ild_layers`` as sorted unique indices (``None``: all layers); ``"0,3,5"``, ``[0, 3, 5]`` or ``"all"``.

    A comma-separated string, as LLaMA-Factory's own list keys (``lora_target``) are written on the
    command line; a YAML list is taken as it is.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "all")):
        return None
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, list | tuple) else [value]
    try:
        layers = [int(str(item).strip()) for item in items]
    except ValueError:
        raise ValueError(f"ild_layers must be 'all' or layer indices like 0,3,5, got {value!r}") from None
    if not layers:
        raise ValueError("ild_layers is empty; use 'all' or list layer indices")
    return sorted(set(layers))


@dataclass
class ZebraArguments:
    """Keys llamafactory-zebra adds to ``llamafactory-cli train`` (docs/sequence-parallel.md, docs/distill.md)."""

    sequence_parallel_size: int = field(
        default=1,
        metadata={
            "help": "Ranks that share one sequence (Ulysses for MLA, halo exchange for GDN); 1 = off. "
            "Must divide the number of processes."
        },
    )
    tiled_mlp: bool = field(
        default=False,
        metadata={"help": "Run every Zebra MLP over sequence tiles (DeepSpeed's TiledMLP) to cut activation memory."},
    )
    distill: Literal["ild", "kd"] | None = field(
        default=None,
        metadata={"help": "Distil from a Transformer teacher: ild (per layer, teacher-forced) or kd (end-to-end KL)."},
    )
    teacher_model_name_or_path: str | None = field(
        default=None, metadata={"help": "The teacher (same tokenizer as the student); needed with distill."}
    )
    kd_kl_weight: float = field(default=1.0, metadata={"help": "kd: weight of the KL term."})
    kd_ce_weight: float = field(default=0.0, metadata={"help": "kd: weight of the student's cross-entropy on labels."})
    kd_temperature: float = field(default=1.0, metadata={"help": "kd: softmax temperature of both distributions."})
    kd_reverse_kl: bool = field(
        default=False, metadata={"help": "kd: KL(student||teacher) instead of KL(teacher||student)."}
    )
    # Written as a string ("0,3,5", "all") or a YAML list; held as sorted indices (None: all) once parsed
    # (``layer_indices``). HfArgumentParser reads the command line with the union's ``str``.
    ild_layers: list[int] | str | None = field(
        default=None,
        metadata={
            "help": "ild: 'all' or comma-separated layer indices (a YAML list works too); a list after parsing."
        },
    )
    ild_loss: Literal["l2", "mse"] = field(default="l2", metadata={"help": "ild: per-layer loss."})
    ild_trainable: Literal["layers", "mixers"] = field(
        default="layers", metadata={"help": "ild: train whole decoder layers, or only their MLA/GDN mixers."}
    )
    # Not a key (``init=False``: the parser skips it): the student's ``trust_remote_code``, which the
    # teacher is loaded with; LLaMA-Factory hands its trainer no model arguments to read it from.
    trust_remote_code: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        # ``parse_dict`` (the YAML path, LLaMA-Factory's too) builds the dataclass without converting or
        # checking the values, so they are checked against the field types here, once for every key.
        hints = typing.get_type_hints(type(self))
        for item in dataclasses.fields(self):
            if item.name not in ("ild_layers", "sequence_parallel_size"):
                _check_value(item.name, getattr(self, item.name), hints[item.name])
        check_sequence_parallel_size(self.sequence_parallel_size)
        self.ild_layers = layer_indices(self.ild_layers)

    @property
    def distilling(self) -> bool:
        return self.distill is not None


KEYS = tuple(f.name for f in dataclasses.fields(ZebraArguments) if f.init)
DISTILL_KEYS = tuple(name for name in KEYS if name.startswith(("teacher_", "kd_", "ild_")))


def _check_value(name: str, value: Any, hint: Any) -> None:
    options = typing.get_args(hint)
    if type(None) in options:
        if value is None:
            return
        (hint,) = (option for option in options if option is not type(None))
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
        return
    number = not isinstance(value, bool)
    expected, valid = {
        bool: ("true or false", isinstance(value, bool)),
        int: ("an integer", number and isinstance(value, int)),
        float: ("a number", number and isinstance(value, int | float)),
        str: ("a string", isinstance(value, str)),
    }[hint]
    if not valid:
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def pop_zebra_arguments(args: dict[str, Any] | list[str]) -> tuple[dict[str, Any] | list[str], ZebraArguments]:
    """``args`` without the plugin's keys, and those keys parsed (every default when none is given).

    ``ValueError`` naming the key for a bad value, and for distillation keys given without ``distill``.
    """
    from transformers import HfArgumentParser

    # No abbreviations (``--tiled`` is not ``--tiled_mlp``), errors raised rather than printed, and no
    # ``-h``: the rest of the command line, ``--help`` included, belongs to LLaMA-Factory.
    parser = HfArgumentParser(ZebraArguments, allow_abbrev=False, exit_on_error=False, add_help=False)
    if isinstance(args, dict):
        rest = {key: value for key, value in args.items() if key not in KEYS}
        given = {key: value for key, value in args.items() if key in KEYS}
        (parsed,) = parser.parse_dict(given)
    else:
        try:
            parsed, rest = parser.parse_args_into_dataclasses(
                args=list(args), return_remaining_strings=True, look_for_args_file=False
            )
        except argparse.ArgumentError as error:
            raise ValueError(str(error)) from None
        options = {item[2:].partition("=")[0].replace("-", "_") for item in args if item.startswith("--")}
        given = options & set(KEYS)
    stray = sorted(set(given) & set(DISTILL_KEYS))
    if stray and not parsed.distilling:
        raise ValueError(f"{', '.join(stray)} need distill: ild or distill: kd")
    return rest, parsed


def store_zebra_arguments(finetuning_args: FinetuningArguments, zebra: ZebraArguments) -> None:
    """Keep the parsed keys with LLaMA-Factory's ``FinetuningArguments`` (handed to every trainer)."""
    setattr(finetuning_args, STORED_ON, zebra)


def zebra_arguments(finetuning_args: FinetuningArguments | None) -> ZebraArguments:
    """The keys stored on ``finetuning_args``; every default for arguments the plugin never parsed."""
    return getattr(finetuning_args, STORED_ON, None) or ZebraArguments()

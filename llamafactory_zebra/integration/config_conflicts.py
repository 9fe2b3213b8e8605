"""Conflicts between the training YAML and its DeepSpeed JSON, found while the arguments are parsed.

transformers records every DeepSpeed value that disagrees with ``TrainingArguments`` when the arguments
are built (``HfTrainerDeepSpeedConfig.trainer_config_process``) but raises only in
``trainer_config_finalize``, when the trainer starts — after LLaMA-Factory has loaded and tokenised the
whole dataset, which at the 1M recipe's scale is hours. This module applies the same rules
(``fill_match``: a DeepSpeed value of ``"auto"`` takes the YAML's value; any other value that is present
must equal it) at argument parsing and says, per conflict, which file holds which value and how to fix
it. transformers' own list (``hf_deepspeed_config.mismatches``) is folded in, so a rule added upstream
is still reported before data loads, if less politely.

Two rules depend on the number of optimizer steps (``scheduler.params.total_num_steps`` and
``warmup_num_steps``); they are checked when ``max_steps`` fixes that number and warned about otherwise.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..hparams import TrainingRun

if TYPE_CHECKING:
    from llamafactory.hparams import TrainingArguments

AUTO = "auto"
_TRANSFORMERS_MISMATCH = re.compile(r"^- ds (\S+)=")
_STEP_KEYS = ("scheduler.params.total_num_steps", "scheduler.params.warmup_num_steps")


@dataclass(frozen=True)
class Conflict:
    """One DeepSpeed key whose value is not ``"auto"`` and differs from what the YAML asks for."""

    key: str
    deepspeed_value: Any
    yaml_key: str
    yaml_value: Any
    fix: str

    def describe(self, deepspeed_file: str, arguments: str) -> str:
        return (
            f"- {deepspeed_file} has {self.key} = {json.dumps(self.deepspeed_value)}, but {arguments} sets "
            f"{self.yaml_key}: {_yaml(self.yaml_value)}. Fix: {self.fix}"
        )


def arguments_source(args: Any = None) -> str:
    """How to name the training arguments in a message: the YAML path when LLaMA-Factory read one."""
    if isinstance(args, dict):
        return "the training arguments"
    argv = args if isinstance(args, list) else sys.argv[1:]
    if argv and str(argv[0]).endswith((".yaml", ".yml", ".json")):
        return str(argv[0])
    return "the command-line arguments"


def deepspeed_file(training_args: TrainingArguments) -> str:
    value = training_args.deepspeed
    return value if isinstance(value, str) else "the DeepSpeed config dict"


def raw_deepspeed_config(training_args: TrainingArguments) -> dict[str, Any] | None:
    """The DeepSpeed config as the user wrote it (``hf_deepspeed_config`` already has its "auto"s filled)."""
    value = getattr(training_args, "deepspeed", None)
    if value is None or isinstance(value, dict):
        return value
    with open(value, encoding="utf-8") as f:
        return json.load(f)


def _yaml(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (bool, list)) else str(value)


def _lookup(config: dict[str, Any], dotted: str) -> Any:
    """The value at ``a.b.c`` or ``None`` when any level is missing (transformers' ``find_config_node``)."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _rules(args: TrainingArguments, num_training_steps: int | None) -> list[tuple[str, Any, str, bool]]:
    """(DeepSpeed key, value the YAML implies, YAML key(s) as the user knows them, must match), in
    ``trainer_config_process`` / ``trainer_config_finalize`` order."""
    auto_batch = bool(getattr(args, "auto_find_batch_size", False))
    world, micro, accumulation = args.world_size, args.per_device_train_batch_size, args.gradient_accumulation_steps
    rules = [
        ("train_micro_batch_size_per_gpu", micro, "per_device_train_batch_size", not auto_batch),
        ("gradient_accumulation_steps", accumulation, "gradient_accumulation_steps", True),
        (
            "train_batch_size",
            world * micro * accumulation,
            f"per_device_train_batch_size x gradient_accumulation_steps x {world} process(es) = "
            f"{micro} x {accumulation} x {world}",
            not auto_batch,
        ),
        ("gradient_clipping", args.max_grad_norm, "max_grad_norm", True),
        ("optimizer.params.lr", args.learning_rate, "learning_rate", True),
        ("optimizer.params.betas", [args.adam_beta1, args.adam_beta2], "[adam_beta1, adam_beta2]", True),
        ("optimizer.params.eps", args.adam_epsilon, "adam_epsilon", True),
        ("optimizer.params.weight_decay", args.weight_decay, "weight_decay", True),
        ("scheduler.params.warmup_max_lr", args.learning_rate, "learning_rate", True),
        ("fp16.enabled", bool(args.fp16 or args.fp16_full_eval), "fp16 (or fp16_full_eval)", True),
        ("bf16.enabled", bool(args.bf16 or args.bf16_full_eval), "bf16 (or bf16_full_eval)", True),
    ]
    if num_training_steps is not None:
        rules += [
            ("scheduler.params.total_num_steps", num_training_steps, "max_steps", True),
            (
                "scheduler.params.warmup_num_steps",
                args.get_warmup_steps(num_training_steps),
                "warmup_steps (or warmup_ratio x max_steps)",
                True,
            ),
        ]
    return rules


def _fix(key: str, deepspeed_value: Any, yaml_key: str, deepspeed_name: str, arguments: str) -> str:
    auto = f'set {key} to "auto" in {deepspeed_name} so it follows {arguments}'
    if key == "train_batch_size":
        return f'{auto} (it is the product on the right; with sequence_parallel_size only "auto" works).'
    if key in ("fp16.enabled", "bf16.enabled"):
        precision = key.split(".")[0]
        return f"set `{precision}: {_yaml(deepspeed_value)}` in {arguments}, or {auto}."
    return f"{auto}, or set `{yaml_key}: {_yaml(deepspeed_value)}` in {arguments}."


def deepspeed_conflicts(training_args: TrainingArguments, arguments: str) -> list[str]:
    """Every YAML/DeepSpeed disagreement transformers would raise at trainer start, as fix-it lines."""
    config = raw_deepspeed_config(training_args)
    if not config:
        return []
    name = deepspeed_file(training_args)
    steps = training_args.max_steps if training_args.max_steps > 0 else None
    lines, checked = [], set()
    for key, yaml_value, yaml_key, must_match in _rules(training_args, steps):
        checked.add(key)
        value = _lookup(config, key)
        if not must_match or value is None or value == AUTO or value == yaml_value:
            continue
        conflict = Conflict(key, value, yaml_key, yaml_value, _fix(key, value, yaml_key, name, arguments))
        lines.append(conflict.describe(name, arguments))
    hf_config = getattr(training_args, "hf_deepspeed_config", None)
    for mismatch in getattr(hf_config, "mismatches", ()):
        match = _TRANSFORMERS_MISMATCH.match(mismatch)
        if match is None or match.group(1) not in checked:
            lines.append(f'{mismatch} (transformers\' check; set it to "auto" in {name})')
    return lines


def check_deepspeed_conflicts(run: TrainingRun) -> None:
    """Raise one ``ValueError`` listing every conflict; nothing when the DeepSpeed config agrees."""
    lines = deepspeed_conflicts(run.training, run.source)
    if lines:
        raise ValueError(
            f"{deepspeed_file(run.training)} conflicts with {run.source}; transformers would stop on this only "
            "when the trainer starts, after the whole dataset is loaded and tokenised:\n" + "\n".join(lines)
        )


def deepspeed_warnings(run: TrainingRun) -> list[str]:
    """What the DeepSpeed JSON silently overrides in the YAML, and step counts not yet knowable."""
    training_args, arguments = run.training, run.source
    config = raw_deepspeed_config(training_args)
    if not config:
        return []
    name, warnings = deepspeed_file(training_args), []
    if "optimizer" in config:
        warnings.append(
            f'{name} has an "optimizer" block ({config["optimizer"].get("type")}): DeepSpeed builds it and '
            f"`optim: {training_args.optim}` in {arguments} is ignored; remove the block to use the YAML's optimizer."
        )
    if "scheduler" in config:
        warnings.append(
            f'{name} has a "scheduler" block ({config["scheduler"].get("type")}): DeepSpeed builds it and '
            f"`lr_scheduler_type: {training_args.lr_scheduler_type}` in {arguments} is ignored; remove the block to "
            "use the YAML's schedule."
        )
    if training_args.max_steps <= 0:
        fixed = [key for key in _STEP_KEYS if _lookup(config, key) not in (None, AUTO)]
        if fixed:
            warnings.append(
                f"{name} fixes {', '.join(fixed)}: transformers compares them with the step count computed from the "
                f'tokenised dataset and stops if they differ; set them to "auto" (or set max_steps in {arguments}).'
            )
    return warnings

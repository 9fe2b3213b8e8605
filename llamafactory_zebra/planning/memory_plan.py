"""Will a training setup fit on the GPUs, and if not, which single change (or which fewest) makes it fit.

``TrainingSetup`` holds only what decides memory; ``yaml_setup.py`` fills it from LLaMA-Factory's
YAML. ``make_plan`` combines the three estimators (model states, activations, inference cache) into
one peak per GPU: the larger of the forward/backward phase (model states + activations) and the
optimizer-step phase (model states + fp32 gradient copies; activations are gone by then).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from ..attention_policy import FLASH_ATTENTION_2, SDPA
from ..configuration_zebra import ZebraConfig
from ..hparams import check_sequence_parallel_size
from ..kernels import Family, Key, packed_attention
from .activations import ActivationEstimate, Kernels, activation_estimate, inference_cache_bytes, loss_memory
from .hardware import usable_bytes
from .model_states import ModelStates, Sharding, model_state_bytes
from .parameters import ParameterSummary, freeze_trainable_params, lora_trainable_params, summarize

DEEPSPEED_PRESETS = {
    "zero3": "deepspeed_configs/ds_z3_bf16.json",
    "offload_optimizer": "deepspeed_configs/ds_z3_bf16_offload_optimizer.json",
    "offload_all": "deepspeed_configs/ds_z3_bf16_offload_all.json",
}


@dataclass(frozen=True)
class TrainingSetup:
    config: ZebraConfig
    model_label: str
    cutoff_len: int
    micro_batch: int
    gpus: int
    gpu_memory: float
    """Bytes per device."""
    gpu_label: str
    sequence_parallel: int = 1
    precision: str = "bf16"
    finetuning_type: str = "full"
    lora_rank: int = 8
    lora_target: tuple[str, ...] = ("all",)
    additional_target: tuple[str, ...] = ()
    freeze_trainable_layers: int = 2
    freeze_trainable_modules: tuple[str, ...] = ("all",)
    freeze_extra_modules: tuple[str, ...] = ()
    gradient_checkpointing: bool = True
    checkpoints_on_cpu: bool = False
    fused_cross_entropy: bool = False
    attention: str = SDPA
    packing: bool = False
    zero_stage: int | None = None
    offload_optimizer: bool = False
    offload_params: bool = False
    reduce_bucket_elements: int = 0
    gather_bucket_elements: int = 0
    deepspeed_label: str = "none"

    def __post_init__(self) -> None:
        for name in ("cutoff_len", "micro_batch", "gpus"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        check_sequence_parallel_size(self.sequence_parallel, self.gpus)
        if self.finetuning_type not in ("full", "lora", "freeze"):
            raise ValueError(f"finetuning_type must be full, lora or freeze, got {self.finetuning_type!r}")

    @property
    def tokens_per_gpu(self) -> int:
        return self.micro_batch * -(-self.cutoff_len // self.sequence_parallel)

    @property
    def act_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @property
    def kernels(self) -> Kernels:
        """What runs on the GPU: fla for GDN; the attention LLaMA-Factory's ``flash_attn`` picks; the loss."""
        loss = Key.LIGER if self.fused_cross_entropy else Key.LOGITS
        return Kernels(attention=self.attention, gdn=Family.FLA, loss=loss)

    def trainable_params(self) -> int:
        c = self.config
        if self.finetuning_type == "lora":
            return lora_trainable_params(c, self.lora_rank, list(self.lora_target), list(self.additional_target))
        if self.finetuning_type == "freeze":
            return freeze_trainable_params(
                c, self.freeze_trainable_layers, list(self.freeze_trainable_modules), list(self.freeze_extra_modules)
            )
        return summarize(c).total


@dataclass(frozen=True)
class MemoryPlan:
    setup: TrainingSetup
    parameters: ParameterSummary
    trainable: int
    states: ModelStates
    activations: ActivationEstimate
    packing_mask: float
    """Packing on a dense-mask kernel (``kernels.packed_attention``; for sdpa only when
    ``ZEBRA_PACKED_SDPA=dense_mask``): the ``[B, 1, T, T]`` boolean block-diagonal mask the model builds."""
    unfused_logits_peak: float
    fused_logits_peak: float
    inference_cache: dict[str, float]

    @property
    def backward_phase(self) -> float:
        return self.states.during_backward + self.activations.peak + self.packing_mask

    @property
    def peak(self) -> float:
        return max(self.backward_phase, self.states.during_step)

    @property
    def usable(self) -> float:
        return usable_bytes(self.setup.gpu_memory)

    @property
    def fits(self) -> bool:
        return self.peak <= self.usable


def make_plan(setup: TrainingSetup) -> MemoryPlan:
    params = summarize(setup.config)
    trainable = setup.trainable_params()
    sharding = Sharding(
        zero_stage=setup.zero_stage,
        world_size=setup.gpus,
        offload_optimizer=setup.offload_optimizer,
        offload_params=setup.offload_params,
        reduce_bucket_elements=setup.reduce_bucket_elements,
        gather_bucket_elements=setup.gather_bucket_elements,
    )
    states = model_state_bytes(params.total, trainable, params.largest_module, sharding, setup.precision)
    tokens = setup.tokens_per_gpu
    kernels = setup.kernels
    activations = activation_estimate(
        setup.config, tokens, setup.act_bytes, kernels, setup.gradient_checkpointing, setup.checkpoints_on_cpu
    )
    # The planner models a GPU: there packed sdpa rows run flex_attention on their borders, no mask.
    dense_mask = packed_attention(setup.attention, "cuda").needs_mask
    mask = setup.micro_batch * setup.cutoff_len**2 if setup.packing and dense_mask else 0

    def logits_peak(loss: str) -> float:
        memory = loss_memory(setup.config, tokens, setup.act_bytes, dataclasses.replace(kernels, loss=loss))
        return memory.saved + memory.peak_extra

    return MemoryPlan(
        setup=setup,
        parameters=params,
        trainable=trainable,
        states=states,
        activations=activations,
        packing_mask=float(mask),
        unfused_logits_peak=logits_peak(Key.LOGITS),
        fused_logits_peak=logits_peak(Key.LIGER),
        inference_cache=inference_cache_bytes(setup.config, setup.cutoff_len, act_bytes=setup.act_bytes),
    )


@dataclass(frozen=True)
class Change:
    description: str
    apply: Callable[[TrainingSetup], TrainingSetup | None]
    """The changed setup, or ``None`` where the change does not apply (already in place)."""


def _deepspeed(stage: int, offload_optimizer: bool, offload_params: bool, preset: str):
    def apply(s: TrainingSetup) -> TrainingSetup | None:
        already = (
            s.zero_stage == stage and s.offload_optimizer >= offload_optimizer and s.offload_params >= offload_params
        )
        if already:
            return None
        h = s.config.hidden_size
        return dataclasses.replace(
            s,
            zero_stage=stage,
            offload_optimizer=offload_optimizer,
            offload_params=offload_params,
            reduce_bucket_elements=h * h,
            gather_bucket_elements=int(0.9 * h * h),
            deepspeed_label=DEEPSPEED_PRESETS[preset],
        )

    return apply


def _sequence_parallel(s: TrainingSetup) -> TrainingSetup | None:
    """The smallest power-of-two SP size (dividing the GPU count) that fits; the largest when none does."""
    sizes = [p for p in (2, 4, 8, 16, 32, 64) if p > s.sequence_parallel and s.gpus % p == 0]
    for size in sizes:
        candidate = dataclasses.replace(s, sequence_parallel=size)
        if make_plan(candidate).fits:
            return candidate
    return dataclasses.replace(s, sequence_parallel=sizes[-1]) if sizes else None


def _when(condition: Callable[[TrainingSetup], bool], **changes) -> Callable[[TrainingSetup], TrainingSetup | None]:
    return lambda s: dataclasses.replace(s, **changes) if condition(s) else None


# Cheapest first: free or faster changes, then ones that cost compute, then communication, then host memory.
CHANGES: tuple[Change, ...] = (
    Change(
        "enable_liger_kernel: true (fused linear cross-entropy)",
        _when(lambda s: not s.fused_cross_entropy, fused_cross_entropy=True),
    ),
    Change(
        "flash_attn: fa2 (packed batches then need no T×T mask)",
        _when(
            lambda s: s.packing and packed_attention(s.attention, "cuda").needs_mask,
            attention=FLASH_ATTENTION_2,
        ),
    ),
    Change(
        "gradient checkpointing on (remove disable_gradient_checkpointing)",
        _when(lambda s: not s.gradient_checkpointing, gradient_checkpointing=True),
    ),
    Change(
        "per_device_train_batch_size: 1 (raise gradient_accumulation_steps to keep the global batch)",
        _when(lambda s: s.micro_batch > 1, micro_batch=1),
    ),
    Change(f"deepspeed: {DEEPSPEED_PRESETS['zero3']}", _deepspeed(3, False, False, "zero3")),
    Change("sequence_parallel_size (split each sequence across GPUs)", _sequence_parallel),
    Change(
        "use_unsloth_gc: true (checkpointed activations in host memory)",
        _when(lambda s: s.gradient_checkpointing and not s.checkpoints_on_cpu, checkpoints_on_cpu=True),
    ),
    Change(f"deepspeed: {DEEPSPEED_PRESETS['offload_optimizer']}", _deepspeed(3, True, False, "offload_optimizer")),
    Change(f"deepspeed: {DEEPSPEED_PRESETS['offload_all']}", _deepspeed(3, True, True, "offload_all")),
)


def describe(change: Change, after: TrainingSetup) -> str:
    if change.apply is _sequence_parallel:
        return f"sequence_parallel_size: {after.sequence_parallel} (split each sequence across GPUs)"
    return change.description


def cheapest_fix(setup: TrainingSetup) -> tuple[list[str], MemoryPlan] | None:
    """The first single change (in ``CHANGES`` order) that fits; else the shortest prefix of changes applied
    together. ``None`` when even all of them do not fit."""
    for change in CHANGES:
        changed = change.apply(setup)
        if changed is not None:
            plan = make_plan(changed)
            if plan.fits:
                return [describe(change, changed)], plan
    applied, current = [], setup
    for change in CHANGES:
        changed = change.apply(current)
        if changed is None:
            continue
        applied.append(describe(change, changed))
        current = changed
        plan = make_plan(current)
        if plan.fits:
            return applied, plan
    return None

"""Per-GPU bytes of parameters, gradients and optimizer states, by DeepSpeed ZeRO stage and offload.

DeepSpeed's own estimators (``estimate_zero{2,3}_model_states_mem_needs``) return one number per
setup; the planner needs the parts (to say *what* to change) and the two phases of a step, because
activations and the optimizer step never coexist: during forward/backward the model states sit next
to the activations, during ``optimizer.step()`` the activations are gone but DeepSpeed materialises an
fp32 copy of each gradient partition (``_prepare_fp32_grad_for_sub_group`` in ``stage3.py``,
``single_partition_of_fp32_groups[i].grad`` in ``stage_1_and_2.py``).

Buffers per trainable parameter, mixed precision with DeepSpeed (each ``/N`` where partitioned):
16-bit parameter 2, 16-bit gradient 2 (ZeRO-3's ``grad_partitions_flat_buffer``), fp32 master 4,
Adam moments 8, and 4 more for the fp32 gradient during the step. ZeRO-3 additionally gathers one
module at a time: its full 16-bit parameters and gradients, 4 bytes × the largest module.
``docs/planning.md`` lists the DeepSpeed source lines and a measurement of these buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

# Adam/AdamW: two moments per trainable parameter.
ADAM_MOMENTS = 2


@dataclass(frozen=True)
class Sharding:
    """How model states are split: ``zero_stage`` None = no DeepSpeed (one replica per GPU)."""

    zero_stage: int | None
    world_size: int = 1
    offload_optimizer: bool = False
    offload_params: bool = False
    reduce_bucket_elements: int = 0
    """ZeRO's gradient bucket (``reduce_bucket_size``), allocated once in 16-bit with contiguous gradients."""
    gather_bucket_elements: int = 0
    """ZeRO-2's ``allgather_bucket_size`` / ZeRO-3's ``stage3_prefetch_bucket_size``."""

    def __post_init__(self) -> None:
        if self.zero_stage not in (None, 0, 1, 2, 3):
            raise ValueError(f"zero_optimization.stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.world_size < 1:
            raise ValueError(f"world size (GPUs) must be at least 1, got {self.world_size}")
        if self.offload_params and self.zero_stage != 3:
            raise ValueError("offload_param needs ZeRO stage 3 (DeepSpeed ignores it otherwise)")


@dataclass(frozen=True)
class ModelStates:
    """Bytes per GPU (and per rank in host memory for offloaded parts)."""

    parameters: float
    gradients: float
    optimizer: float
    """fp32 master weights (mixed precision) and the Adam moments."""
    gathered: float
    """ZeRO-3: full 16-bit parameters and gradients of the module being computed."""
    step_extra: float
    """Only during ``optimizer.step()``: fp32 copies of the gradient partitions."""
    autocast_copies: float
    """No DeepSpeed, fp32 trainable weights: autocast's bf16 copies, kept for backward."""
    buffers: float
    """ZeRO communication buckets."""
    cpu_per_rank: float

    @property
    def during_backward(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.gathered + self.autocast_copies + self.buffers

    @property
    def during_step(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.step_extra + self.buffers


def model_state_bytes(
    total_params: int,
    trainable_params: int,
    largest_module_params: int,
    sharding: Sharding,
    precision: str,
) -> ModelStates:
    """Per-GPU model-state bytes.

    ``precision``: ``bf16``/``fp16`` (16-bit compute, fp32 master weights), ``pure_bf16`` (LLaMA-Factory's
    ``pure_bf16``: everything in bf16, no master copy) or ``fp32``.
    """
    if precision not in ("bf16", "fp16", "pure_bf16", "fp32"):
        raise ValueError(f"precision must be bf16, fp16, pure_bf16 or fp32, got {precision!r}")
    if not 0 <= trainable_params <= total_params:
        raise ValueError(f"trainable parameters ({trainable_params}) must lie in [0, total ({total_params})]")
    P, T, L, N = total_params, trainable_params, largest_module_params, sharding.world_size
    if sharding.zero_stage is None:
        return _replicated(P, T, N, precision)

    stage = sharding.zero_stage
    param_bytes = 4 if precision == "fp32" else 2
    master_bytes = 4 if precision in ("bf16", "fp16") else 0
    moment_bytes = param_bytes if precision == "pure_bf16" else 4
    optimizer_per_param = master_bytes + ADAM_MOMENTS * moment_bytes
    step_copy = 4 if master_bytes else 0

    params = 0 if sharding.offload_params else param_bytes * P / (N if stage == 3 else 1)
    grads = 0 if (stage >= 2 and sharding.offload_optimizer) else param_bytes * T / (N if stage >= 2 else 1)
    optimizer = 0 if sharding.offload_optimizer else optimizer_per_param * T / (N if stage >= 1 else 1)
    step_extra = 0 if sharding.offload_optimizer else step_copy * T / (N if stage >= 1 else 1)
    gathered = 2 * param_bytes * L if stage == 3 else 0
    buffers = param_bytes * (sharding.reduce_bucket_elements + sharding.gather_bucket_elements)

    cpu = 0.0
    if sharding.offload_optimizer:
        cpu += (optimizer_per_param + step_copy + param_bytes) * T / N
    if sharding.offload_params:
        cpu += param_bytes * P / N
    return ModelStates(params, grads, optimizer, gathered, step_extra, 0.0, buffers, cpu)


def _replicated(P: int, T: int, N: int, precision: str) -> ModelStates:
    """Every GPU holds everything (LLaMA-Factory without DeepSpeed: single GPU or DDP).

    LLaMA-Factory upcasts trainable parameters to fp32 unless ``pure_bf16`` (``model/adapter.py``) and the
    Trainer runs bf16 autocast, whose cast cache keeps a 16-bit copy of each trainable weight for backward.
    DDP (N > 1) adds its gradient buckets, one fp32 copy of the gradients.
    """
    F = P - T
    if precision == "pure_bf16":
        params, grads, optimizer, copies = 2 * P, 2 * T, ADAM_MOMENTS * 2 * T, 0
    elif precision == "fp32":
        params, grads, optimizer, copies = 4 * P, 4 * T, ADAM_MOMENTS * 4 * T, 0
    else:
        params, grads, optimizer, copies = 4 * T + 2 * F, 4 * T, ADAM_MOMENTS * 4 * T, 2 * T
    buckets = grads if N > 1 else 0
    return ModelStates(params, grads, optimizer, 0.0, 0.0, copies, buckets, 0.0)

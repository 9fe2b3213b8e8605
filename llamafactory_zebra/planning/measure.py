"""Measure what the activation formulas predict, on CPU: saved-tensor bytes and the peak of one training step.

Two measurements, chosen because neither depends on the allocator's caching or on other processes
(RSS does both):

* ``saved``: every tensor autograd keeps for backward passes through
  ``torch.autograd.graph.saved_tensors_hooks``; their distinct storages, parameters excluded, are
  exactly the "activations" of the formulas.
* ``peak``: ``torch.profiler`` with ``profile_memory=True`` reports each CPU allocation and free with
  the running total of bytes allocated *since profiling started*; its maximum over forward + backward
  is the step's peak above what existed before (parameters, inputs). The running total is read from
  the profiler's event tree (``experimental_event_tree``), the same data ``torch.profiler``'s memory
  timeline is built from, relative to its value when the session started.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile


@dataclass(frozen=True)
class StepMemory:
    saved: int
    """Bytes of distinct non-parameter storages saved for backward by one forward."""
    peak: int
    """Peak bytes allocated during forward + backward, above the memory in use before it."""


def _saved_bytes(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int:
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(**batch).loss
    loss.backward()
    return sum(storages.values())


def _peak_bytes(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        # Only the loss survives the forward, as in the HF Trainer's training_step (logits are dropped).
        loss = model(**batch).loss
        loss.backward()
        del loss
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        fields = node.extra_fields
        if type(fields).__name__ == "_ExtraFields_Allocation" and fields.device.type == "cpu":
            events.append((node.start_time_ns, fields.total_allocated, fields.alloc_size))
    if not events:
        return 0
    # The running total is process-wide and never forgets blocks from an earlier profiling session that
    # were freed outside one; the total before this session's first event is the baseline.
    first = min(events)
    return max(total for _, total, _ in events) - (first[1] - first[2])


def measure_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> StepMemory:
    """Measure one forward + backward of ``model(**batch).loss`` (gradients are cleared afterwards)."""
    model.zero_grad(set_to_none=True)
    saved = _saved_bytes(model, batch)
    model.zero_grad(set_to_none=True)
    peak = _peak_bytes(model, batch)
    model.zero_grad(set_to_none=True)
    return StepMemory(saved=saved, peak=peak)


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one flat buffer count once)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t is not None}
    return sum(storages.values())


def deepspeed_state_bytes(engine) -> dict[str, int]:
    """The model-state buffers a DeepSpeed ZeRO-2/3 engine holds between steps, by kind.

    Read from the optimizer's own attributes (``stage3.py``: ``fp32_partitioned_groups_flat``,
    ``grad_partitions_flat_buffer``; ``stage_1_and_2.py``: ``single_partition_of_fp32_groups``), so it
    checks the planner's buffer list against what DeepSpeed actually allocated.
    """
    zero = engine.optimizer
    adam = [v for state in zero.optimizer.state.values() for v in state.values() if torch.is_tensor(v) and v.dim()]
    if engine.zero_optimization_stage() == 3:
        params = [p.ds_tensor for p in engine.module.parameters()]
        grads = [zero.grad_partitions_flat_buffer]
        master = list(zero.fp32_partitioned_groups_flat)
    else:
        params = list(engine.module.parameters())
        grads = [g for group in zero.averaged_gradients.values() for g in (group or [])]
        master = list(zero.single_partition_of_fp32_groups)
    return {
        "parameters": _storage_bytes(params),
        "gradients": _storage_bytes(grads),
        "optimizer": _storage_bytes(master) + _storage_bytes(adam),
    }

"""What ``doctor`` reports is what the ops call, on a matrix of faked machines.

For each machine — this CPU; this CPU without a C++ compiler; an H200 with Triton 3.6 or 3.7.1, with and
without fla; an MI300X with ROCm — and each op, the row ``resolve()`` gives (the table ``doctor`` prints
and the training preflight logs) names a registry key; the op is then called the way the model and the
serving layer call it, on inputs of that machine's device, and every implementation the op could run is
replaced by a spy that records its key. On the CPU the spies call through (real tensors, real kernels);
for a faked GPU the inputs are ``FakeTensorMode`` tensors on ``cuda`` (shapes and dtypes, no data), so the
spies return outputs of the right shape (in a forked child: see :func:`on_the_machine`). The machine is
faked the documented way, ``ZEBRA_FAKE_STACK``.

The serving ops (``ops/gated_delta_rule/in_slots.py``: prompt chunks and decode steps on state slots) and the
gated RMSNorm are checked the same way; the serving layer's conv choice, which needs vLLM, in
``tests_vllm/test_kernel_choice.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import multiprocessing
import traceback
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from llamafactory_zebra.kernels import (
    FAKE_STACK_ENV_VAR,
    KERNELS,
    EntryPoint,
    Key,
    Op,
    Stack,
    decider,
    resolve,
    this_machine,
)
from llamafactory_zebra.ops import backend
from llamafactory_zebra.ops.gated_delta_rule import dispatch, in_slots
from llamafactory_zebra.testing.models import tiny_model

# ``ops/__init__`` exports the function ``causal_conv1d`` under the module's name.
conv_module = importlib.import_module("llamafactory_zebra.ops.causal_conv1d")
gated_norm_module = importlib.import_module("llamafactory_zebra.ops.gated_rms_norm")
HOPPER = ("cuda", "NVIDIA H200", (9, 0), "sm_90")


def _h200(triton: str, fla: bool) -> Stack:
    versions = {"torch": "2.11.0", "triton": triton, "liger-kernel": "0.8.5"} | ({"fla-core": "0.6.0"} if fla else {})
    return Stack(*HOPPER, versions, toolkit="CUDA 13.0", faked=True)


MACHINES = {
    "cpu": dataclasses.replace(this_machine(), faked=True),
    "cpu, no compiler": dataclasses.replace(this_machine(), compiler=None, faked=True),
    "h200 triton 3.6 fla": _h200("3.6.0", True),
    "h200 triton 3.6 no fla": _h200("3.6.0", False),
    "h200 triton 3.7.1 fla": _h200("3.7.1", True),
    "h200 triton 3.7.1 no fla": _h200("3.7.1", False),
    "mi300x rocm": Stack(
        "rocm",
        "AMD Instinct MI300X",
        (9, 4),
        "gfx942",
        {"torch": "2.10.0+rocm7.1", "pytorch-triton-rocm": "3.5.0", "fla-core": "0.6.0"},
        toolkit="ROCm 7.1",
        faked=True,
    ),
}
PHASE_OF = {
    Op.GDN_CHUNK: dict(training=True),
    Op.CONV: dict(training=True),
    Op.LOSS: dict(training=True),
    Op.DISTILLATION_LOSS: dict(training=True),
    Op.GDN_RECURRENT: dict(training=False),
    Op.ATTENTION: dict(training=False),
    Op.GDN_PREFILL_IN_SLOTS: dict(training=False, serving=True),
    Op.GDN_DECODE_STEP: dict(training=False, serving=True),
    Op.GATED_NORM: dict(training=False, serving=True),
}


def _as_json(stack: Stack) -> str:
    fields = dict(device=stack.device, name=stack.name, capability=stack.capability, arch=stack.arch)
    fields |= dict(versions=dict(stack.versions), cpu_features=sorted(stack.cpu_features), compiler=stack.compiler)
    return json.dumps(fields | dict(platform=stack.platform, toolkit=stack.toolkit))


@pytest.fixture(params=list(MACHINES), ids=list(MACHINES))
def machine(request, monkeypatch):
    for variable in ("ZEBRA_GDN_BACKEND", "ZEBRA_GDN_TORCH_CHUNK", "ZEBRA_CPU_KERNELS", "ZEBRA_PACKED_SDPA"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, _as_json(MACHINES[request.param]))
    monkeypatch.setattr(backend, "fla_module", _fla_stand_in)
    monkeypatch.setattr(decider, "_unusable", {})
    decider._select.cache_clear()
    yield MACHINES[request.param]
    decider._select.cache_clear()


def _fla_stand_in(module: str) -> types.ModuleType:
    """fla as the ops import it, without importing it (and without the ROCm seams its loading installs)."""
    return types.ModuleType(module)


def doctor_row(stack: Stack, op: str, **settings) -> str:
    """The registry key of ``op``'s row in the table doctor prints for ``stack``."""
    return resolve(stack, **PHASE_OF[op], **settings).choice(op).key


def spies(monkeypatch, op: Op, call_through: bool, fake_output, entry_point: EntryPoint = EntryPoint.RUN) -> list[str]:
    """Record the key of every entry of ``op`` the registry runs at ``entry_point`` (``decider.implementation``,
    which ``run`` asks for the chosen entry's function)."""
    called: list[str] = []
    implementation = decider.implementation

    def spied(kernel, point=EntryPoint.RUN):
        function = implementation(kernel, point)
        if kernel.op != op or point != entry_point:
            return function

        @functools.wraps(function)
        def recorded(*args, **kwargs):
            called.append(kernel.key)
            return function(*args, **kwargs) if call_through else fake_output(*args, **kwargs)

        return recorded

    monkeypatch.setattr(decider, "implementation", spied)
    return called


def on_the_machine(stack: Stack, run: Callable[[str], Any]) -> Any:
    """``run(device)`` with the machine's inputs: in this process for a CPU; for a faked GPU in a forked child,
    under ``FakeTensorMode`` (a fake CUDA tensor makes every later fork's backward fail, ``Autograd-and-Fork``,
    so the test process never makes one). The spies and switches set up here reach the child with the fork."""
    if not stack.has_gpu:
        return run("cpu")
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_faked_gpu, args=(run, send))
    child.start()
    send.close()
    if not receive.poll(300):
        child.kill()
        raise TimeoutError("the faked-GPU child gave no answer in 300 s")
    failed, result = receive.recv()
    child.join(60)
    if failed:
        raise AssertionError(f"in the faked-GPU child:\n{result}")
    return result


def _faked_gpu(run: Callable[[str], Any], send) -> None:
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            send.send((False, run("cuda")))
    except BaseException:
        send.send((True, traceback.format_exc()))


def _gdn_inputs(device: str, tokens: int = 70, heads: int = 2, dim: int = 16):
    generator = torch.Generator().manual_seed(0) if device == "cpu" else None
    q, k, v = (torch.randn(1, tokens, heads, dim, generator=generator, device=device) for _ in range(3))
    g = -torch.rand(1, tokens, heads, generator=generator, device=device)
    beta = torch.rand(1, tokens, heads, generator=generator, device=device)
    return [t.to(torch.bfloat16) if t.ndim == 4 else t for t in (q, k, v)] + [g, beta]


def _gdn_fake_output(q, k, v, g, beta, **options):
    return torch.empty_like(v), torch.empty(q.shape[0], q.shape[2], q.shape[3], v.shape[3], device=q.device)


def test_gdn_chunk(machine, monkeypatch):
    called = spies(monkeypatch, Op.GDN_CHUNK, not machine.has_gpu, _gdn_fake_output)

    def run(device):
        dispatch.chunk_gated_delta_rule(*_gdn_inputs(device), output_final_state=True)
        return called

    assert on_the_machine(machine, run) == [doctor_row(machine, Op.GDN_CHUNK)]


def test_gdn_recurrent(machine, monkeypatch):
    called = spies(monkeypatch, Op.GDN_RECURRENT, not machine.has_gpu, _gdn_fake_output)

    def run(device):
        dispatch.fused_recurrent_gated_delta_rule(*_gdn_inputs(device, tokens=1), output_final_state=True)
        return called

    assert on_the_machine(machine, run) == [doctor_row(machine, Op.GDN_RECURRENT)]


def test_conv_over_sequences_and_decode_steps(machine, monkeypatch):
    real = not machine.has_gpu
    sequence = spies(monkeypatch, Op.CONV, real, lambda x, *a: (x, None), entry_point=EntryPoint.SEQUENCE)
    step = spies(monkeypatch, Op.CONV, real, lambda x, state, *a: (x, state), entry_point=EntryPoint.STEP)

    def run(device):
        x, weight = torch.randn(1, 9, 8, device=device), torch.randn(8, 4, device=device)
        conv_module.causal_conv1d(x, weight)
        conv_module.causal_conv1d_update(x[:, 0], torch.zeros(1, 8, 4, device=device), weight)
        return sequence, step

    assert on_the_machine(machine, run) == ([doctor_row(machine, Op.CONV)], [doctor_row(machine, Op.CONV)])


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_packed_attention(machine, implementation):
    """The function MLA's packed rows call, and whether the model hands them borders or a dense mask."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from llamafactory_zebra.layers import mla

    model = tiny_model(dtype=torch.float32, attn_implementation=implementation)
    layer = next(layer.mla for layer in model.model.layers if hasattr(layer, "mla"))
    key = doctor_row(machine, Op.ATTENTION, attn_implementation=implementation)
    kernel = next(k for k in KERNELS if k.op == Op.ATTENTION and k.key == key)
    expected = decider.implementation(kernel) if kernel.has_function else None
    if expected is None:  # the dense mask: the model's own attention function reads it
        expected = (
            mla.eager_attention_forward if implementation == "eager" else ALL_ATTENTION_FUNCTIONS[implementation]
        )

    def run(device):
        query = torch.empty(1, 4, 8, 32, device=device)
        borders = decider.packed_attention(implementation, query.device.type).reads_borders
        return mla.expanded_attention_kernel(layer, True, query) is expected, borders

    assert on_the_machine(machine, run) == (True, key != Key.DENSE_MASK)


def test_flash_attention_with_flash_attn_installed(monkeypatch):
    """FA2 asked for on a GPU with flash-attn: the varlen path, in doctor's row and in the layer."""
    from llamafactory_zebra.layers import mla

    stack = dataclasses.replace(MACHINES["h200 triton 3.7.1 fla"], versions={"flash-attn": "2.8.3"})
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, _as_json(stack))
    row = resolve(stack, training=True, attn_implementation="flash_attention_2").choice(Op.ATTENTION)
    model = tiny_model(attn_implementation="sdpa")
    model.config._attn_implementation = "flash_attention_2"  # flash-attn itself is not installed here
    layer = next(layer.mla for layer in model.model.layers if hasattr(layer, "mla"))
    expected = mla.flash_attention_forward

    def run(device):
        return mla.expanded_attention_kernel(layer, True, torch.empty(1, 4, 8, 32, device=device)) is expected

    assert row.key == "flash_varlen" and on_the_machine(stack, run)


def test_fused_loss(machine, monkeypatch):
    """The model's training loss (``enable_liger_kernel``): ``loss.py`` runs the registry's choice at the forward."""
    from llamafactory_zebra import loss

    called = spies(monkeypatch, Op.LOSS, False, lambda hidden, *a, **k: hidden.float().sum())
    model = tiny_model(dtype=torch.float32)
    predicted = model.enable_fused_cross_entropy("auto")

    def run(device):
        hidden = torch.randn(1, 8, model.config.hidden_size, device=device, dtype=torch.bfloat16)
        weight = torch.randn(model.config.vocab_size, model.config.hidden_size, device=device, dtype=torch.bfloat16)
        labels = torch.zeros(1, 8, dtype=torch.long, device=device)
        loss.fused_causal_lm_loss(hidden, weight, labels)
        return called

    assert on_the_machine(machine, run) == [doctor_row(machine, Op.LOSS)] == [predicted]


def test_distillation_loss(machine, monkeypatch):
    from llamafactory_zebra.distill import kd_loss

    called = spies(monkeypatch, Op.DISTILLATION_LOSS, False, lambda *a, **k: (None, None, None))

    def run(device):
        hidden, weight = torch.randn(6, 8, device=device), torch.randn(11, 8, device=device)
        targets = torch.zeros(6, dtype=torch.long, device=device)
        kd_loss.kd_loss_sums(hidden, weight, hidden, weight, targets)
        return called

    assert on_the_machine(machine, run) == [doctor_row(machine, Op.DISTILLATION_LOSS)]


# The slot numbers and prompt borders: real CPU tensors on every machine, as the ops read them on the host
# (a fake tensor has no values to check).
SLOTS, BORDERS, FRESH = torch.tensor([3, 1]), torch.tensor([0, 5, 12]), torch.tensor([False, True])


def _slot_inputs(device: str, tokens: int, dtype: torch.dtype):
    heads, dim, slots = 2, 8, 5
    generator = torch.Generator().manual_seed(1) if device == "cpu" else None
    q, k, v = (torch.randn(1, tokens, heads, dim, generator=generator, device=device).to(dtype) for _ in range(3))
    g = -torch.rand(1, tokens, heads, generator=generator, device=device)
    beta = torch.rand(1, tokens, heads, generator=generator, device=device)
    state = torch.randn(slots, heads, dim, dim, generator=generator, device=device)
    return q, k, v, g, beta, state


def test_serving_prefill_in_slots(machine, monkeypatch):
    called = spies(
        monkeypatch,
        Op.GDN_PREFILL_IN_SLOTS,
        not machine.has_gpu,
        lambda q, k, v, *a, **kw: torch.empty_like(v),
    )

    def run(device):
        q, k, v, g, beta, state = _slot_inputs(device, 12, torch.bfloat16)
        in_slots.chunk_gated_delta_rule_in_slots(q, k, v, g, beta, state, SLOTS, BORDERS, FRESH)
        return called

    assert on_the_machine(machine, run) == [doctor_row(machine, Op.GDN_PREFILL_IN_SLOTS)]


def test_serving_decode_step(machine, monkeypatch):
    called = spies(
        monkeypatch,
        Op.GDN_DECODE_STEP,
        not machine.has_gpu,
        lambda q, k, v, *a, **kw: torch.empty_like(v),
    )

    def run(device):
        q, k, v, g, beta, state = _slot_inputs(device, 2, torch.bfloat16)
        in_slots.fused_recurrent_gated_delta_rule_in_slots(q[0], k[0], v[0], g[0], beta[0], state, SLOTS)
        return called

    assert on_the_machine(machine, run) == [doctor_row(machine, Op.GDN_DECODE_STEP)]


def test_gated_rms_norm(machine, monkeypatch):
    called = spies(monkeypatch, Op.GATED_NORM, not machine.has_gpu, lambda x, *a: torch.empty_like(x))

    def run(device):
        x = torch.randn(3, 2, 8, device=device).to(torch.bfloat16)
        gated_norm_module.gated_rms_norm(x, x.clone(), torch.ones(8, device=device), 1e-6)
        return called

    assert on_the_machine(machine, run) == [doctor_row(machine, Op.GATED_NORM)]

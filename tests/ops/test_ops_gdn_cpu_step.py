"""The C++ GDN decode step on CPU state slots (``ops/cpu/cpu_step.py``) against the fp64 token-by-token
reference, the op's choice between it and the PyTorch step, and the build of the package's C++ CPU kernels
(``ops/cpu/build.py``) that holds it."""

import logging

import pytest
import torch
import torch.nn.functional as F

import llamafactory_zebra.ops.cpu.build as cpu_build
from llamafactory_zebra.kernels import Call, KernelLoadError, Op, decider, select
from llamafactory_zebra.kernels.switches import CPU_KERNELS_ENV_VAR
from llamafactory_zebra.ops import (
    cpu_kernels,
    fused_recurrent_gated_delta_rule_in_slots,
    naive_recurrent_gated_delta_rule,
)


def reference_step(q, k, v, g, beta, state, scale):
    """One token per sequence through the project's token-by-token reference (``naive.py``), in fp64."""
    o, final = naive_recurrent_gated_delta_rule(
        *(t[:, None].double() for t in (q, k, v, g, beta)),
        scale=scale, initial_state=state.double(), output_final_state=True, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    return o[:, 0], final


def inputs(seqs, heads, key_dim, value_dim, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(seqs, heads, key_dim, generator=gen) for _ in range(2))
    v = torch.randn(seqs, heads, value_dim, generator=gen)
    g = F.logsigmoid(torch.randn(seqs, heads, generator=gen) + 1.0)
    beta = torch.rand(seqs, heads, generator=gen)
    return q, k, v, g, beta


def test_the_extension_builds_on_this_machine():
    # Linux with a C++ compiler (the README's test setup): the build must work, not quietly fall back.
    assert cpu_kernels() is not None


def test_two_installs_of_the_sources_build_under_two_names(monkeypatch):
    here = cpu_build._build_name()
    monkeypatch.setattr(cpu_build, "HERE", cpu_build.HERE.parent / "elsewhere")
    assert cpu_build._build_name() != here


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("heads", "key_dim", "value_dim"), [(6, 256, 512), (3, 7, 11), (2, 33, 65)])
def test_kernel_matches_the_reference_and_leaves_other_slots_alone(heads, key_dim, value_dim, threads):
    seqs, slots_total = 5, 9
    q, k, v, g, beta = inputs(seqs, heads, key_dim, value_dim)
    cache = torch.randn(slots_total, heads, key_dim, value_dim, generator=torch.Generator().manual_seed(1)) * 0.1
    slots = torch.tensor([6, 0, 3, 8, 2])
    before = cache.clone()
    expected_o, expected_states = reference_step(q, k, v, g, beta, before[slots], key_dim**-0.5)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        o = fused_recurrent_gated_delta_rule_in_slots(q, k, v, g, beta, cache, slots, use_qk_l2norm_in_kernel=True)
    finally:
        torch.set_num_threads(previous_threads)
    torch.testing.assert_close(o.double(), expected_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache[slots].double(), expected_states, rtol=1e-5, atol=1e-5)
    untouched = [i for i in range(slots_total) if i not in slots.tolist()]
    assert torch.equal(cache[untouched], before[untouched])


@pytest.fixture
def kernel_calls(monkeypatch):
    calls = []
    implementation = decider.implementation

    def counting(kernel, point):
        function = implementation(kernel, point)
        if kernel.op != Op.GDN_DECODE_STEP or kernel.key != "cpp":
            return function
        return lambda *args, **kwargs: calls.append(1) or function(*args, **kwargs)

    monkeypatch.setattr(decider, "implementation", counting)
    return calls


@pytest.mark.parametrize(
    ("case", "uses_kernel"),
    [
        ("fp32 state, rows of V contiguous", True),
        ("bf16 activations on an fp32 state", True),
        ("transposed state view", False),
        ("bf16 state", True),
        ("fp64 inputs and state", False),
        ("ZEBRA_CPU_KERNELS=torch", False),
    ],
)
def test_the_op_takes_the_kernel_only_where_it_fits(case, uses_kernel, kernel_calls, monkeypatch):
    q, k, v, g, beta = inputs(3, 2, 8, 16)
    cache = torch.randn(4, 2, 8, 16) * 0.1
    if case == "bf16 activations on an fp32 state":
        q, k, v, beta = (t.bfloat16() for t in (q, k, v, beta))
    elif case == "transposed state view":
        cache = torch.randn(4, 2, 16, 8).transpose(-1, -2) * 0.1
    elif case == "bf16 state":
        cache = cache.bfloat16()
    elif case == "fp64 inputs and state":
        q, k, v, g, beta, cache = (t.double() for t in (q, k, v, g, beta, cache))
    elif case == "ZEBRA_CPU_KERNELS=torch":
        monkeypatch.setenv(CPU_KERNELS_ENV_VAR, "torch")
    expected_o, expected_states = reference_step(q, k, v, g, beta, cache[[2, 0, 3]], 8**-0.5)
    o = fused_recurrent_gated_delta_rule_in_slots(
        q, k, v, g, beta, cache, torch.tensor([2, 0, 3]), use_qk_l2norm_in_kernel=True
    )
    assert bool(kernel_calls) == uses_kernel
    tolerance = 2e-2 if torch.bfloat16 in (q.dtype, cache.dtype) else 1e-5
    torch.testing.assert_close(o.double(), expected_o, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(cache[[2, 0, 3]].double(), expected_states, rtol=tolerance, atol=tolerance)


def test_a_bf16_state_is_stepped_as_the_pytorch_step_steps_it(monkeypatch):
    """A bf16 cache (``--mamba-ssm-cache-dtype bfloat16``): the kernel computes in fp32 and rounds each state
    once, as the PyTorch step does; both leave the other slots alone."""
    q, k, v, g, beta = inputs(4, 3, 16, 24)
    cache = (torch.randn(7, 3, 16, 24, generator=torch.Generator().manual_seed(2)) * 0.3).bfloat16()
    slots = torch.tensor([5, 1, 2, 6])
    results = []
    for choice in ("auto", "torch"):
        monkeypatch.setenv(CPU_KERNELS_ENV_VAR, choice)
        stepped = cache.clone()
        o = fused_recurrent_gated_delta_rule_in_slots(q, k, v, g, beta, stepped, slots, use_qk_l2norm_in_kernel=True)
        results.append((o, stepped))
    (o_kernel, kernel_cache), (o_torch, torch_cache) = results
    torch.testing.assert_close(o_kernel, o_torch, rtol=1e-5, atol=1e-5)
    one_step = kernel_cache[slots].float().abs().clamp(min=2**-126) * 2**-7
    assert ((kernel_cache[slots].float() - torch_cache[slots].float()).abs() <= one_step).all()
    assert torch.equal(kernel_cache[[0, 3, 4]], cache[[0, 3, 4]])


def test_an_unknown_switch_value_is_refused(monkeypatch):
    monkeypatch.setenv(CPU_KERNELS_ENV_VAR, "fast")
    q, k, v, g, beta = inputs(1, 1, 4, 4)
    with pytest.raises(ValueError, match="ZEBRA_CPU_KERNELS='fast' is not valid; use one of auto, torch"):
        fused_recurrent_gated_delta_rule_in_slots(q, k, v, g, beta, torch.zeros(2, 1, 4, 4), torch.tensor([0]))


def test_a_failed_build_keeps_the_pytorch_step_with_a_warning(monkeypatch, caplog):
    import torch.utils.cpp_extension

    def no_compiler(**kwargs):
        raise RuntimeError("Error building extension: c++: not found")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    monkeypatch.setattr(decider, "_unusable", {})  # the registry forgets the failure after the test
    cpu_build._build.cache_clear()
    decider._select.cache_clear()
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(KernelLoadError, match="did not build"):
            cpu_kernels()
        q, k, v, g, beta = inputs(2, 2, 8, 16)
        cache = torch.randn(3, 2, 8, 16) * 0.1
        expected_o, _ = reference_step(q, k, v, g, beta, cache[[1, 0]], 8**-0.5)
        o = fused_recurrent_gated_delta_rule_in_slots(
            q, k, v, g, beta, cache, torch.tensor([1, 0]), use_qk_l2norm_in_kernel=True
        )
        torch.testing.assert_close(o.double(), expected_o, rtol=1e-5, atol=1e-5)
        assert (
            select(Op.GDN_DECODE_STEP, Call.of(q, state_dtype=cache.dtype, state_rows_contiguous=True)).kernel.key
            == "torch"
        )
    finally:
        cpu_build._build.cache_clear()  # the next test loads the real build again (cached on disk)
        decider._select.cache_clear()
    message = caplog.text
    assert "could not build the C++ CPU kernels (RuntimeError: Error building extension: c++: not found)" in message
    assert "ZEBRA_CPU_KERNELS=torch" in message

"""The gated RMSNorm op (``ops/gated_rms_norm.py``): its one-pass C++ CPU path against the PyTorch formula,
which calls take it, and the formula against a plain fp64 computation."""

import importlib

import pytest
import torch
import torch.nn.functional as F

from llamafactory_zebra.kernels.switches import CPU_KERNELS_ENV_VAR
from llamafactory_zebra.ops import gated_rms_norm
from llamafactory_zebra.ops.gated_rms_norm import gated_rms_norm_reference

# The modules (``ops.gated_rms_norm`` is its function of that name): the op's, and its C++ kernel's wrapper.
gated_rms_norm_module = importlib.import_module("llamafactory_zebra.ops.gated_rms_norm")
kernel_wrapper_module = importlib.import_module("llamafactory_zebra.ops.cpu.gated_rms_norm")


def inputs(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen) * 3
    gate = torch.randn(*shape, generator=gen) * 6  # far into both tails of the sigmoid
    weight = 1 + 0.3 * torch.randn(shape[-1], generator=gen)
    return x.to(dtype), gate.to(dtype), weight


def test_the_formula_is_rmsnorm_times_weight_times_silu_of_the_gate():
    x, gate, weight = inputs((3, 4, 33), torch.float64)
    expected = torch.empty_like(x)
    for index in torch.cartesian_prod(torch.arange(3), torch.arange(4)).tolist():
        row, g = x[tuple(index)], gate[tuple(index)]
        rms = (row.pow(2).sum() / row.numel() + 1e-6).sqrt()
        expected[tuple(index)] = row / rms * weight.double() * g / (1 + torch.exp(-g))
    torch.testing.assert_close(gated_rms_norm(x, gate, weight, 1e-6), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(2048, 6, 512), (5, 3, 7), (1, 1, 130)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_cpu_kernel_equals_the_formula(shape, dtype, threads):
    x, gate, weight = inputs(shape, dtype)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fast = gated_rms_norm(x, gate, weight, 1e-6)
    finally:
        torch.set_num_threads(previous)
    reference = gated_rms_norm_reference(x, gate, weight, 1e-6)
    assert fast.dtype == dtype and fast.shape == x.shape
    if dtype == torch.float32:
        torch.testing.assert_close(fast, reference, rtol=2e-6, atol=1e-6)
    else:  # both round one fp32 value to bf16: at most one bf16 step apart, and rarely that
        differ = fast != reference
        step = reference.float().abs().clamp(min=2**-126) * 2**-7
        assert ((fast.float() - reference.float()).abs() <= step).all()
        assert differ.float().mean() < 1e-3


@pytest.fixture
def kernel_calls(monkeypatch):
    calls = []
    real = kernel_wrapper_module.cpu_kernels

    def counting():
        kernel = real()
        calls.append(kernel is not None)
        return kernel

    monkeypatch.setattr(kernel_wrapper_module, "cpu_kernels", counting)
    return calls


@pytest.mark.parametrize(
    ("case", "uses_kernel"),
    [("bf16", True), ("fp32", True), ("fp64", False), ("needs a gradient", False), ("ZEBRA_CPU_KERNELS=torch", False)],
)
def test_the_op_takes_the_kernel_only_where_it_fits(case, uses_kernel, kernel_calls, monkeypatch):
    dtype = {"bf16": torch.bfloat16, "fp64": torch.float64}.get(case, torch.float32)
    x, gate, weight = inputs((4, 2, 16), dtype)
    if case == "needs a gradient":
        x.requires_grad_()
    if case == "ZEBRA_CPU_KERNELS=torch":
        monkeypatch.setenv(CPU_KERNELS_ENV_VAR, "torch")
    out = gated_rms_norm(x, gate, weight, 1e-5)
    assert any(kernel_calls) == uses_kernel
    torch.testing.assert_close(out, gated_rms_norm_reference(x, gate, weight, 1e-5), rtol=1e-2, atol=1e-2)
    if case == "needs a gradient":  # the PyTorch path is differentiable
        out.sum().backward()
        expected = torch.autograd.grad(gated_rms_norm_reference(x, gate, weight, 1e-5).sum(), x)[0]
        torch.testing.assert_close(x.grad, expected)


def test_the_training_layer_norm_is_the_op():
    from llamafactory_zebra.layers.norms import ZebraGatedRMSNorm

    norm = ZebraGatedRMSNorm(16, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(1 + torch.randn(16))
    x, gate, _ = inputs((3, 16), torch.float64)
    expected = F.rms_norm(x, (16,), norm.weight.double(), 1e-5) * F.silu(gate)
    torch.testing.assert_close(norm(x, gate), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_differentiable_path_keeps_its_inputs_only_and_gives_autograds_gradients(dtype):
    """With gradients the formula keeps x, gate and weight (no activation-sized intermediate) and recomputes in
    backward: output and gradients equal autograd through the formula bit for bit."""
    x, gate, weight = (t.requires_grad_() for t in inputs((40, 2, 64), dtype))
    upstream = torch.randn(40, 2, 64, generator=torch.Generator().manual_seed(3)).to(dtype)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        got = gated_rms_norm_reference(x, gate, weight, 1e-6)
    assert [t.data_ptr() for t in saved] == [x.data_ptr(), gate.data_ptr(), weight.data_ptr()]
    grads = torch.autograd.grad(got, (x, gate, weight), upstream)
    want = gated_rms_norm_module._gated_rms_norm_formula(x, gate, weight, 1e-6)
    want_grads = torch.autograd.grad(want, (x, gate, weight), upstream)
    assert torch.equal(got, want)
    for mine, theirs in zip(grads, want_grads, strict=True):
        assert torch.equal(mine, theirs)


def test_the_differentiable_path_gives_gradients_to_what_needs_them_only():
    x, gate, weight = inputs((5, 3, 16), torch.float64)
    x.requires_grad_()
    (dx,) = torch.autograd.grad(gated_rms_norm_reference(x, gate, weight, 1e-6).sum(), (x,))
    (want,) = torch.autograd.grad(gated_rms_norm_module._gated_rms_norm_formula(x, gate, weight, 1e-6).sum(), (x,))
    assert torch.equal(dx, want) and gate.grad is None and weight.grad is None

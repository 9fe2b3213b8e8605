"""The GPU-shaped PyTorch gated delta rule (``chunk_parallel.py``) against the fp64 token-by-token reference,
and the choice between it and ``chunk.py`` (the kernel registry's ``GDN chunk`` op)."""

import pytest
import torch
from test_ops_gated_delta_rule import (
    NAMES,
    assert_close,
    backprop,
    leaves,
    make_inputs,
    run,
)

from llamafactory_zebra.kernels import Call, Op, decider, select
from llamafactory_zebra.kernels.switches import TORCH_CHUNK_ENV_VAR
from llamafactory_zebra.ops import BACKEND_ENV_VAR
from llamafactory_zebra.ops.gated_delta_rule import (
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_parallel,
    chunk_gated_delta_rule_torch,
    naive_recurrent_gated_delta_rule,
)
from llamafactory_zebra.testing.models import tiny_model

# A 1-token segment, an empty one, exactly one chunk (64), chunk + 1 (65), an odd tail (3), two chunks + 7.
PACKED = [0, 1, 1, 65, 130, 133, 268]


def assert_exact_in_fp64(shape, use_h0, use_l2norm, cu_seqlens=None, tol=1e-11, **kwargs):
    """Output, final state and the gradients of every input equal the reference's to fp64 rounding."""
    base = make_inputs(*shape, num_seqs=None if cu_seqlens is None else len(cu_seqlens) - 1)
    ours, ref = leaves(base, torch.float64), leaves(base, torch.float64)
    extra = dict(cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=use_l2norm)
    o, s = run(chunk_gated_delta_rule_parallel, ours, use_h0, **extra, **kwargs)
    o_ref, s_ref = run(naive_recurrent_gated_delta_rule, ref, use_h0, **extra)
    assert o.dtype == torch.float64 and s.dtype == torch.float64
    assert_close(o, o_ref, "output", tol)
    assert_close(s, s_ref, "final state", tol)
    backprop(o, s)
    backprop(o_ref, s_ref)
    for name, mine, theirs in zip(NAMES, ours, ref, strict=True):
        if name == "initial_state" and not use_h0:
            assert mine.grad is None
            continue
        assert_close(mine.grad, theirs.grad, f"grad {name}", tol)


@pytest.mark.parametrize(
    "shape, use_h0, use_l2norm",
    [
        ((1, 130, 2, 16, 32), True, False),  # T not a multiple of 64, K < V as Zebra's (256 < 512)
        ((2, 63, 3, 8, 12), False, True),  # batch rows, one partial chunk
        ((3, 129, 1, 12, 8), True, True),  # K > V, a one-token third chunk
        ((1, 1, 2, 8, 16), True, False),  # a single token
    ],
)
def test_matches_reference_in_fp64(shape, use_h0, use_l2norm):
    assert_exact_in_fp64(shape, use_h0, use_l2norm)


@pytest.mark.parametrize("use_h0, use_l2norm", [(True, True), (False, False)])
def test_packed_uneven_segments_match_reference_in_fp64(use_h0, use_l2norm):
    cu = torch.tensor(PACKED, dtype=torch.int32)
    assert_exact_in_fp64((1, PACKED[-1], 2, 16, 32), use_h0, use_l2norm, cu)


def test_packed_segments_do_not_leak_into_each_other():
    """Changing one segment's inputs changes neither another segment's outputs nor its final state."""
    cu = torch.tensor(PACKED)
    base = make_inputs(1, PACKED[-1], 2, 8, 16, num_seqs=len(PACKED) - 1)
    o, s = run(chunk_gated_delta_rule_parallel, base, True, cu_seqlens=cu)
    changed = [t.clone() for t in base]
    start, end = PACKED[3], PACKED[4]  # the 65-token segment, index 3
    for t in changed[:3]:
        t[:, start:end] += 1.0
    changed[5][3] += 1.0
    o2, s2 = run(chunk_gated_delta_rule_parallel, changed, True, cu_seqlens=cu)
    others = torch.ones(PACKED[-1], dtype=torch.bool)
    others[start:end] = False
    assert torch.equal(o[:, others], o2[:, others])
    assert torch.equal(s[torch.arange(6) != 3], s2[torch.arange(6) != 3])
    assert not torch.equal(o[:, start:end], o2[:, start:end])
    assert torch.equal(s[1], base[5][1]), "an empty segment returns its initial state"


def test_custom_scale_and_unnormalised_keys():
    base = make_inputs(1, 70, 2, 8, 8, normalize_k=False)
    base[1] = base[1] * 0.3
    o, s = run(chunk_gated_delta_rule_parallel, base, True, scale=0.7)
    o_ref, s_ref = run(naive_recurrent_gated_delta_rule, base, True, scale=0.7)
    assert_close(o, o_ref, "output with scale 0.7", 1e-11)
    assert_close(s, s_ref, "final state with scale 0.7", 1e-11)


def test_equals_the_cpu_tuned_chunk_op_in_fp32():
    cu = torch.tensor(PACKED)
    base = make_inputs(1, PACKED[-1], 2, 16, 32, num_seqs=len(PACKED) - 1)
    results = []
    for fn in (chunk_gated_delta_rule_parallel, chunk_gated_delta_rule_torch):
        tensors = leaves(base, torch.float32)
        o, s = run(fn, tensors, True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
        backprop(o, s)
        results.append([o, s, *(t.grad for t in tensors)])
    for what, mine, theirs in zip(("output", "final state", *NAMES), *results, strict=True):
        assert_close(mine, theirs, what, 1e-4)


def test_bf16_inputs_stay_close_to_fp64():
    cu = torch.tensor(PACKED)
    base = make_inputs(1, PACKED[-1], 2, 32, 64, num_seqs=len(PACKED) - 1)
    o_ref, s_ref = run(naive_recurrent_gated_delta_rule, base, True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    half = [t.bfloat16().requires_grad_() for t in base[:5]] + [base[5].float().requires_grad_()]
    o, s = run(chunk_gated_delta_rule_parallel, half, True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    assert (o.double() - o_ref).abs().max() < 0.03 * o_ref.abs().max()
    assert (s.double() - s_ref).abs().max() < 0.03 * s_ref.abs().max()
    backprop(o, s)
    assert all(t.grad is not None and t.grad.dtype == t.dtype and t.grad.isfinite().all() for t in half)


@pytest.mark.slow
def test_compiled_matches_reference_in_fp64():
    """``compile=True`` (``torch.compile`` of the whole-chunk parts; needs a C++ compiler on CPU; ~45 s of
    compilation in a fresh process)."""
    cu = torch.tensor(PACKED)
    assert_exact_in_fp64((1, PACKED[-1], 2, 16, 32), True, True, cu, compile=True)


def test_choice_follows_the_device_and_the_env_var(monkeypatch):
    def chosen(device_type: str):
        return decider.implementation(select(Op.GDN_CHUNK, Call.on(device_type)).kernel)

    monkeypatch.setenv(BACKEND_ENV_VAR, "torch")
    monkeypatch.delenv(TORCH_CHUNK_ENV_VAR, raising=False)
    assert chosen("cpu") is chunk_gated_delta_rule_torch and chosen("cuda") is chunk_gated_delta_rule_parallel
    monkeypatch.setenv(TORCH_CHUNK_ENV_VAR, "parallel")
    assert chosen("cpu") is chunk_gated_delta_rule_parallel
    monkeypatch.setenv(TORCH_CHUNK_ENV_VAR, "chunk")
    assert chosen("cuda") is chunk_gated_delta_rule_torch
    monkeypatch.setenv(TORCH_CHUNK_ENV_VAR, "parallel-compiled")
    assert chosen("cpu").keywords == {"compile": True}
    monkeypatch.setenv(TORCH_CHUNK_ENV_VAR, "fast")
    with pytest.raises(ValueError, match=f"{TORCH_CHUNK_ENV_VAR}='fast' is not valid; use one of auto, chunk"):
        chosen("cpu")


def test_dispatch_runs_the_chosen_path(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV_VAR, "torch")
    q, k, v, g, beta, h0 = make_inputs(1, 70, 2, 8, 8)
    for choice, fn in (("parallel", chunk_gated_delta_rule_parallel), ("chunk", chunk_gated_delta_rule_torch)):
        monkeypatch.setenv(TORCH_CHUNK_ENV_VAR, choice)
        o, s = chunk_gated_delta_rule(q, k, v, g, beta, 0.5, h0, True)
        o_ref, s_ref = fn(q, k, v, g, beta, scale=0.5, initial_state=h0, output_final_state=True)
        assert torch.equal(o, o_ref) and torch.equal(s, s_ref), choice


def test_model_loss_and_gradients_equal_on_either_torch_path(monkeypatch):
    """The tiny Zebra, packed rows in fp64: same loss and parameter gradients through both PyTorch paths."""
    monkeypatch.setenv(BACKEND_ENV_VAR, "torch")
    tokens = torch.randint(0, 97, (1, 90), generator=torch.Generator().manual_seed(0))
    position_ids = torch.cat([torch.arange(n) for n in (1, 70, 19)])[None]
    results = {}
    for choice in ("chunk", "parallel"):
        monkeypatch.setenv(TORCH_CHUNK_ENV_VAR, choice)
        torch.manual_seed(0)
        model = tiny_model(dtype=torch.float64).train()
        loss = model(tokens, position_ids=position_ids, labels=tokens).loss
        loss.backward()
        results[choice] = loss.detach(), {n: p.grad for n, p in model.named_parameters()}
    (loss_a, grads_a), (loss_b, grads_b) = results.values()
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-12, atol=0)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-9, atol=1e-12, msg=name)


def test_state_steps_backward_passes_gradcheck():
    """The step loop's hand-written backward against finite differences (fp64, 3 steps, 2 maps)."""
    from llamafactory_zebra.ops.gated_delta_rule.chunk_parallel import _AffineStateSteps

    gen = torch.Generator().manual_seed(0)
    inputs = [
        torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
        for shape in ((3, 2, 4, 4), (3, 2, 4, 5), (2, 4, 5))
    ]
    assert torch.autograd.gradcheck(_AffineStateSteps.apply, inputs)


def test_a_bf16_autocast_does_not_lower_the_precision():
    """The layer may run under ``torch.autocast(bfloat16)``; the op keeps computing in fp32."""
    q, k, v, g, beta, h0 = (t.float() for t in make_inputs(1, 100, 2, 16, 32))
    plain = chunk_gated_delta_rule_parallel(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = chunk_gated_delta_rule_parallel(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    for mine, theirs in zip(autocast, plain, strict=True):
        assert mine.dtype == torch.float32 and torch.equal(mine, theirs)

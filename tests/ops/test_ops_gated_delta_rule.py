"""PyTorch gated delta rule (chunked and recurrent) against the fp64 token-by-token reference."""

import pytest
import torch
import torch.nn.functional as F

from llamafactory_zebra.ops import (
    BACKEND_ENV_VAR,
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_torch,
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gated_delta_rule_torch,
    naive_recurrent_gated_delta_rule,
)

TOL = 1e-4
NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def make_inputs(batch, length, heads, key_dim, value_dim, num_seqs=None, seed=0, normalize_k=True):
    """fp64 tensors shaped like the Zebra layer's inputs (k unit-norm, g <= 0, beta in (0, 1))."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, length, heads, key_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(batch, length, heads, key_dim, generator=gen, dtype=torch.float64)
    if normalize_k:
        k = F.normalize(k, dim=-1)
    v = torch.randn(batch, length, heads, value_dim, generator=gen, dtype=torch.float64)
    g = F.logsigmoid(torch.randn(batch, length, heads, generator=gen, dtype=torch.float64) + 2.0)
    beta = torch.rand(batch, length, heads, generator=gen, dtype=torch.float64)
    h0 = torch.randn(num_seqs or batch, heads, key_dim, value_dim, generator=gen, dtype=torch.float64)
    return [q, k, v, g, beta, h0]


def leaves(tensors, dtype):
    return [t.detach().to(dtype).requires_grad_() for t in tensors]


def run(fn, tensors, use_h0, **kwargs):
    q, k, v, g, beta, h0 = tensors
    return fn(q, k, v, g, beta, initial_state=h0 if use_h0 else None, output_final_state=True, **kwargs)


def backprop(o, state, seed=1):
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)
    ds = torch.randn(state.shape, generator=gen, dtype=torch.float64).to(state.dtype)
    ((o * do).sum() + (state * ds).sum()).backward()


def assert_close(actual, expected, what, tol=TOL):
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if actual.numel() == 0:
        return
    err = (actual.double() - expected.double()).abs().max().item()
    assert err <= tol, f"{what}: max abs error {err:.3e} > {tol:.0e}"


def assert_matches_reference(fn, shape, use_h0, use_l2norm, cu_seqlens=None, dtype=torch.float32, **kw):
    base = make_inputs(*shape, num_seqs=None if cu_seqlens is None else len(cu_seqlens) - 1, **kw)
    ours, ref = leaves(base, dtype), leaves(base, torch.float64)
    extra = dict(cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=use_l2norm)
    o, s = run(fn, ours, use_h0, **extra)
    o_ref, s_ref = run(naive_recurrent_gated_delta_rule, ref, use_h0, **extra)
    assert o.dtype == dtype and s.dtype == torch.float32
    assert_close(o, o_ref, "output")
    assert_close(s, s_ref, "final state")
    backprop(o, s)
    backprop(o_ref, s_ref)
    for name, mine, theirs in zip(NAMES, ours, ref, strict=True):
        if name == "initial_state" and not use_h0:
            continue
        assert_close(mine.grad, theirs.grad, f"grad {name}")


@pytest.mark.parametrize(
    "shape, use_h0, use_l2norm",
    [
        ((1, 130, 2, 16, 24), True, False),  # T not a multiple of 64, K != V, three chunks
        ((2, 63, 3, 8, 12), False, True),  # one partial chunk, batch of two, l2norm in kernel
        ((2, 65, 1, 12, 8), True, True),  # K > V, a one-token second chunk
        ((1, 1, 4, 8, 16), True, False),  # a single token
    ],
)
def test_chunk_matches_reference(shape, use_h0, use_l2norm):
    assert_matches_reference(chunk_gated_delta_rule_torch, shape, use_h0, use_l2norm)


def test_chunk_unnormalized_keys_and_custom_scale():
    base = make_inputs(1, 70, 2, 8, 8, normalize_k=False)
    base[1] = base[1] * 0.3
    ours, ref = leaves(base, torch.float32), leaves(base, torch.float64)
    o, _ = run(chunk_gated_delta_rule_torch, ours, True, scale=0.7)
    o_ref, _ = run(naive_recurrent_gated_delta_rule, ref, True, scale=0.7)
    assert_close(o, o_ref, "output with scale 0.7")


# Segment lengths 1 and 2 are shorter than the conv width, 0 is an empty segment, 70/81 cross chunks.
UNEVEN = [0, 70, 71, 73, 73, 154]


@pytest.mark.parametrize("use_h0, use_l2norm", [(True, True), (False, False)])
def test_chunk_varlen_matches_reference(use_h0, use_l2norm):
    cu = torch.tensor(UNEVEN, dtype=torch.int32)
    assert_matches_reference(chunk_gated_delta_rule_torch, (1, UNEVEN[-1], 2, 8, 16), use_h0, use_l2norm, cu)


def test_chunk_backward_keeps_only_inputs_and_entering_states_and_its_grads_are_exact():
    """The chunked rule saves its chunked inputs, the in-chunk log-decays and the state entering each chunk, and
    recomputes the ``C x C`` and ``2C x K`` in-chunk intermediates in backward; in fp64 the output, final state
    and every gradient still equal the token-by-token reference to 1e-10."""
    cu = torch.tensor(UNEVEN, dtype=torch.int32)
    base = make_inputs(1, UNEVEN[-1], 2, 8, 16, num_seqs=len(UNEVEN) - 1)
    ours, ref = leaves(base, torch.float64), leaves(base, torch.float64)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        o, s = run(chunk_gated_delta_rule_torch, ours, True, cu_seqlens=cu)
    chunks = 2 + 1 + 1 + 0 + 2  # segments of 70, 1, 2, 0 and 81 tokens in chunks of 64
    assert sorted(saved) == sorted(
        [(chunks, 2, 64, 8)] * 2 + [(chunks, 2, 64, 16), (chunks, 2, 64), (chunks, 2, 64), (chunks, 2, 8, 16)]
    )
    o_ref, s_ref = run(naive_recurrent_gated_delta_rule, ref, True, cu_seqlens=cu)
    assert_close(o, o_ref, "output", tol=1e-10)
    assert_close(s, s_ref, "final state", tol=1e-10)
    backprop(o, s)
    backprop(o_ref, s_ref)
    for name, mine, theirs in zip(NAMES, ours, ref, strict=True):
        assert_close(mine.grad, theirs.grad, f"grad {name}", tol=1e-10)


@pytest.mark.parametrize("fn", [chunk_gated_delta_rule_torch, fused_recurrent_gated_delta_rule_torch])
def test_varlen_equals_each_segment_alone(fn):
    cu = torch.tensor(UNEVEN, dtype=torch.int64)
    packed = make_inputs(1, UNEVEN[-1], 2, 8, 16, num_seqs=len(UNEVEN) - 1)
    o, s = run(fn, packed, True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    for seq, (start, end) in enumerate(zip(UNEVEN[:-1], UNEVEN[1:], strict=True)):
        alone = [t[:, start:end] for t in packed[:5]] + [packed[5][seq : seq + 1]]
        o_alone, s_alone = run(fn, alone, True, use_qk_l2norm_in_kernel=True)
        assert_close(o[:, start:end], o_alone, f"segment {seq} output", tol=1e-10)
        assert_close(s[seq : seq + 1], s_alone, f"segment {seq} state", tol=1e-10)
    assert torch.equal(s[3], packed[5][3]), "an empty segment must return its initial state"


@pytest.mark.parametrize("cu_seqlens", [None, torch.tensor(UNEVEN)])
def test_fused_recurrent_matches_reference(cu_seqlens):
    shape = (1, UNEVEN[-1], 2, 8, 16) if cu_seqlens is not None else (3, 20, 2, 8, 16)
    assert_matches_reference(fused_recurrent_gated_delta_rule_torch, shape, True, True, cu_seqlens)


def test_chunk_state_continued_by_recurrent_steps_equals_one_run():
    q, k, v, g, beta, h0 = make_inputs(2, 100, 2, 8, 16)
    split = 77
    o_full, s_full = chunk_gated_delta_rule_torch(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o_a, s_a = chunk_gated_delta_rule_torch(
        q[:, :split],
        k[:, :split],
        v[:, :split],
        g[:, :split],
        beta[:, :split],
        initial_state=h0,
        output_final_state=True,
    )
    outputs, state = [o_a], s_a
    for t in range(split, 100):
        step = [x[:, t : t + 1] for x in (q, k, v, g, beta)]
        o_t, state = fused_recurrent_gated_delta_rule_torch(*step, initial_state=state, output_final_state=True)
        outputs.append(o_t)
    assert_close(torch.cat(outputs, dim=1), o_full, "continued output", tol=1e-10)
    assert_close(state, s_full, "continued state", tol=1e-10)


def test_bf16_inputs_stay_close_to_fp32():
    base = make_inputs(1, 200, 2, 32, 32)
    o32, s32 = run(chunk_gated_delta_rule_torch, [t.float() for t in base], True, use_qk_l2norm_in_kernel=True)
    half = [t.bfloat16() for t in base[:5]] + [base[5].float()]
    o16, s16 = run(chunk_gated_delta_rule_torch, half, True, use_qk_l2norm_in_kernel=True)
    assert o16.dtype == torch.bfloat16 and s16.dtype == torch.float32
    scale = o32.abs().max().item()
    assert (o16.float() - o32).abs().max().item() < 0.03 * scale
    assert (s16 - s32).abs().max().item() < 0.03 * s32.abs().max().item()


def test_dispatch_on_cpu_uses_torch_and_takes_fla_positional_order(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV_VAR, "auto")
    q, k, v, g, beta, h0 = make_inputs(1, 40, 2, 8, 8)
    o, s = chunk_gated_delta_rule(q, k, v, g, beta, 0.5, h0, True)
    o_ref, s_ref = chunk_gated_delta_rule_torch(q, k, v, g, beta, scale=0.5, initial_state=h0, output_final_state=True)
    assert torch.equal(o, o_ref) and torch.equal(s, s_ref)
    o, s = fused_recurrent_gated_delta_rule(q, k, v, g, beta, 0.5, h0, True)
    assert_close(o, o_ref, "fused recurrent via dispatch", tol=1e-10)


def test_backend_env_var_is_validated(monkeypatch):
    q, k, v, g, beta, _ = make_inputs(1, 4, 1, 4, 4)
    monkeypatch.setenv(BACKEND_ENV_VAR, "fla")
    with pytest.raises(RuntimeError, match="fla"):
        chunk_gated_delta_rule(q, k, v, g, beta)
    monkeypatch.setenv(BACKEND_ENV_VAR, "triton")
    with pytest.raises(ValueError, match=BACKEND_ENV_VAR):
        chunk_gated_delta_rule(q, k, v, g, beta)


def _bad_calls():
    q, k, v, g, beta, h0 = make_inputs(2, 10, 2, 4, 6)
    flat = [t[:1] for t in (q, k, v, g, beta)]
    return {
        "k shape": ((q, k[..., :3], v, g, beta), {}, "k must have"),
        "v heads": ((q, k, v[:, :, :1], g, beta), {}, "v must have"),
        "g shape": ((q, k, v, g[..., None], beta), {}, "g must have"),
        "dtype": ((q, k.float(), v, g, beta), {}, "one dtype"),
        "q rank": ((q[0], k[0], v[0], g[0], beta[0]), {}, "q must have"),
        "state shape": ((q, k, v, g, beta), {"initial_state": h0[:1]}, "initial_state must have"),
        "batch with cu": ((q, k, v, g, beta), {"cu_seqlens": torch.tensor([0, 10])}, "batch size must be 1"),
        "cu end": ((*flat,), {"cu_seqlens": torch.tensor([0, 4, 9])}, "end at the sequence length 10"),
        "cu start": ((*flat,), {"cu_seqlens": torch.tensor([1, 10])}, "start at 0"),
        "cu order": ((*flat,), {"cu_seqlens": torch.tensor([0, 6, 4, 10])}, "non-decreasing"),
        "cu dtype": ((*flat,), {"cu_seqlens": torch.tensor([0.0, 10.0])}, "int32 or int64"),
        "cu states": ((*flat,), {"cu_seqlens": torch.tensor([0, 4, 10]), "initial_state": h0[:1]}, r"\(2, 2, 4, 6\)"),
    }


@pytest.mark.parametrize("case", list(_bad_calls()))
@pytest.mark.parametrize(
    "fn", [chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, naive_recurrent_gated_delta_rule]
)
def test_invalid_inputs_raise(case, fn):
    args, kwargs, message = _bad_calls()[case]
    with pytest.raises(ValueError, match=message):
        fn(*args, **kwargs)

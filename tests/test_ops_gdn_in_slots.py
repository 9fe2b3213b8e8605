"""The in-place decode step on slots of a state cache, against the fp64 token-by-token reference."""

import pytest
import torch
import torch.nn.functional as F

from llamafactory_zebra.ops import fused_recurrent_gated_delta_rule_in_slots, naive_recurrent_gated_delta_rule


def step_inputs(seqs, heads, key_dim, value_dim, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(seqs, heads, key_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(seqs, heads, key_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(seqs, heads, value_dim, generator=gen, dtype=torch.float64)
    g = F.logsigmoid(torch.randn(seqs, heads, generator=gen, dtype=torch.float64) + 1.0)
    beta = torch.rand(seqs, heads, generator=gen, dtype=torch.float64)
    return q, k, v, g, beta


def reference_step(q, k, v, g, beta, states, use_l2norm):
    """One token per sequence through the naive rule: ``[N, 1, H, D]`` batches."""
    o, final = naive_recurrent_gated_delta_rule(
        q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
        initial_state=states, output_final_state=True, use_qk_l2norm_in_kernel=use_l2norm,
    )  # fmt: skip
    return o[:, 0], final


def cache_of(slots, heads, key_dim, value_dim, value_major, dtype, seed=1):
    """A ``[slots, H, K, V]`` state view: contiguous, or a transposed view of a ``[slots, H, V, K]`` cache."""
    gen = torch.Generator().manual_seed(seed)
    shape = (slots, heads, value_dim, key_dim) if value_major else (slots, heads, key_dim, value_dim)
    storage = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    return storage.transpose(-1, -2) if value_major else storage


@pytest.mark.parametrize("value_major", [False, True])
@pytest.mark.parametrize("use_l2norm", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_step_matches_reference_and_leaves_other_slots_alone(value_major, use_l2norm, dtype):
    seqs, heads, key_dim, value_dim = 5, 3, 7, 11
    q, k, v, g, beta = step_inputs(seqs, heads, key_dim, value_dim)
    cache = cache_of(9, heads, key_dim, value_dim, value_major, dtype)
    slots = torch.tensor([6, 0, 3, 8, 2])
    before = cache.clone()
    expected_o, expected_states = reference_step(q, k, v, g, beta, before[slots].double(), use_l2norm)

    o = fused_recurrent_gated_delta_rule_in_slots(
        *(t.to(dtype) for t in (q, k, v, g, beta)), cache, slots, use_qk_l2norm_in_kernel=use_l2norm
    )

    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert o.dtype == dtype
    torch.testing.assert_close(o.double(), expected_o, atol=tol, rtol=tol)
    torch.testing.assert_close(cache[slots].double(), expected_states, atol=tol, rtol=tol)
    untouched = sorted(set(range(9)) - set(slots.tolist()))
    assert torch.equal(cache[untouched], before[untouched])


def test_steps_chain_like_the_sequence_run_token_by_token():
    """Four steps on slots equal the reference run over the four tokens at once (state carried in place)."""
    seqs, heads, key_dim, value_dim, steps = 3, 2, 8, 6, 4
    tokens = [step_inputs(seqs, heads, key_dim, value_dim, seed=s) for s in range(steps)]
    cache = cache_of(4, heads, key_dim, value_dim, True, torch.float32)
    slots = torch.tensor([3, 1, 0])
    start = cache[slots].double()
    outputs = [fused_recurrent_gated_delta_rule_in_slots(*(t.float() for t in tok), cache, slots) for tok in tokens]
    stacked = [torch.stack([tok[i] for tok in tokens], dim=1) for i in range(5)]
    expected_o, expected_states = naive_recurrent_gated_delta_rule(
        *stacked, initial_state=start, output_final_state=True
    )
    torch.testing.assert_close(torch.stack(outputs, 1).double(), expected_o, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(cache[slots].double(), expected_states, atol=2e-5, rtol=2e-5)


def test_bf16_inputs_and_bf16_state_slots():
    """bf16 activations are stepped in fp32; a bf16 state slot is converted for the step and written back."""
    seqs, heads, key_dim, value_dim = 4, 2, 16, 8
    q, k, v, g, beta = step_inputs(seqs, heads, key_dim, value_dim)
    inputs = [t.bfloat16() for t in (q, k, v, g, beta)]
    cache = cache_of(4, heads, key_dim, value_dim, True, torch.bfloat16)
    slots = torch.tensor([2, 0, 1, 3])
    expected_o, expected_states = reference_step(*(t.double() for t in inputs), cache[slots].double(), True)
    o = fused_recurrent_gated_delta_rule_in_slots(*inputs, cache, slots, use_qk_l2norm_in_kernel=True)
    assert o.dtype == torch.bfloat16 and cache.dtype == torch.bfloat16
    torch.testing.assert_close(o.double(), expected_o, atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(cache[slots].double(), expected_states, atol=3e-2, rtol=2e-2)


def test_bad_arguments_are_named():
    q, k, v, g, beta = (t.float() for t in step_inputs(2, 2, 4, 3))
    cache = torch.zeros(3, 2, 4, 3)
    with pytest.raises(ValueError, match="state_indices must be distinct"):
        fused_recurrent_gated_delta_rule_in_slots(q, k, v, g, beta, cache, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match=r"state must have shape \[slots, H, K, V\]"):
        fused_recurrent_gated_delta_rule_in_slots(q, k, v, g, beta, cache.transpose(-1, -2), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"beta must have shape \[N, H\]"):
        fused_recurrent_gated_delta_rule_in_slots(q, k, v, g, beta[:1], cache, torch.tensor([0, 1]))

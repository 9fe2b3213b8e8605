"""Short causal convolution: packed borders, state carry and decode steps against a per-token loop."""

import pytest
import torch
import torch.nn.functional as F

from llamafactory_zebra.ops import causal_conv1d, causal_conv1d_update

WIDTH = 4


def reference_conv(x, weight, bias, activation, initial_state, starts, lengths):
    """Per token: sum over the W newest inputs of its own sequence, reading the initial state before it."""
    outputs, finals = [], []
    for seq, (start, length) in enumerate(zip(starts, lengths, strict=True)):
        history = (
            initial_state[seq].t() if initial_state is not None else x.new_zeros(WIDTH, x.shape[-1])
        )  # [W, D], oldest first
        stream = torch.cat([history, x[start : start + length]])
        for t in range(length):
            window = stream[t + 1 : t + 1 + WIDTH]  # W newest rows ending at token t
            y = (window.t() * weight).sum(-1) + (bias if bias is not None else 0)
            outputs.append(F.silu(y) if activation else y)
        finals.append(stream[-WIDTH:].t())
    return torch.stack(outputs), torch.stack(finals)


def make(num_tokens, channels=5, num_seqs=1, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, channels, generator=gen, dtype=torch.float64)
    weight = torch.randn(channels, WIDTH, generator=gen, dtype=torch.float64)
    bias = torch.randn(channels, generator=gen, dtype=torch.float64)
    state = torch.randn(num_seqs, channels, WIDTH, generator=gen, dtype=torch.float64)
    return [t.requires_grad_() for t in (x, weight, bias, state)]


# Segments of 1 and 2 tokens are shorter than the kernel, an empty one keeps its state; 9 spans more than two windows.
LENGTHS = [3, 1, 0, 9, 2, 5]


@pytest.mark.parametrize("use_state, use_bias, activation", [(True, True, "silu"), (False, False, None)])
def test_packed_conv_matches_per_sequence_reference(use_state, use_bias, activation):
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    x, weight, bias, state = make(sum(LENGTHS), num_seqs=len(LENGTHS))
    kwargs = dict(bias=bias if use_bias else None, activation=activation, initial_state=state if use_state else None)
    y, final = causal_conv1d(x[None], weight, output_final_state=True, cu_seqlens=cu, **kwargs)
    y_ref, final_ref = reference_conv(x, weight, kwargs["bias"], activation, kwargs["initial_state"], cu[:-1], LENGTHS)
    torch.testing.assert_close(y[0], y_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(final, final_ref, rtol=0, atol=1e-12)

    grads = torch.autograd.grad(
        (y[0] * y_ref.detach().sin()).sum() + final.sum(), [x, weight, state, bias], allow_unused=True
    )
    grads_ref = torch.autograd.grad(
        (y_ref * y_ref.detach().sin()).sum() + final_ref.sum(), [x, weight, state, bias], allow_unused=True
    )
    for name, mine, theirs in zip(("x", "weight", "initial_state", "bias"), grads, grads_ref, strict=True):
        if theirs is None:
            assert mine is None, name
        else:
            torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12, msg=f"grad {name}")


@pytest.mark.parametrize("use_state, use_bias", [(True, True), (False, False)])
def test_training_calls_keep_only_their_inputs_and_get_autograds_gradients(use_state, use_bias):
    """Without a final state (training) the conv keeps its inputs alone for backward and runs again there:
    output and gradients equal autograd through the one-pass path bit for bit."""
    from llamafactory_zebra.ops.causal_conv1d import _causal_conv1d_torch_pass

    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    x, weight, bias, state = (t.detach().float().requires_grad_() for t in make(sum(LENGTHS), num_seqs=len(LENGTHS)))
    args = (x[None], weight, bias if use_bias else None, "silu", state if use_state else None)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y, final = causal_conv1d(*args[:2], bias=args[2], initial_state=args[4], cu_seqlens=cu)
    assert final is None
    assert {t.data_ptr() for t in saved} == {t.data_ptr() for t in (x, weight, cu, *args[2:5:2]) if t is not None}
    want, _ = _causal_conv1d_torch_pass(*args, False, cu)
    leaves = [t for t in (x, weight, args[2], args[4]) if t is not None]
    upstream = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
    assert torch.equal(y, want)
    for mine, theirs in zip(
        torch.autograd.grad(y, leaves, upstream), torch.autograd.grad(want, leaves, upstream), strict=True
    ):
        assert torch.equal(mine, theirs)


def test_no_tokens_at_all_return_the_initial_state():
    x, weight, bias, state = [t.detach() for t in make(0, num_seqs=2)]
    cu = torch.tensor([0, 0, 0], dtype=torch.int32)
    y, final = causal_conv1d(x[None], weight, bias, initial_state=state, output_final_state=True, cu_seqlens=cu)
    assert y.shape == (1, 0, x.shape[-1])
    assert torch.equal(final, state)


def test_batched_rows_are_independent_sequences():
    x, weight, bias, state = make(2 * 7, num_seqs=2)
    y, final = causal_conv1d(x.view(2, 7, -1), weight, bias, initial_state=state, output_final_state=True)
    y_ref, final_ref = reference_conv(x, weight, bias, "silu", state, [0, 7], [7, 7])
    torch.testing.assert_close(y.reshape(14, -1), y_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(final, final_ref, rtol=0, atol=1e-12)


def test_state_carry_and_decode_steps_equal_one_pass():
    x, weight, bias, _ = [t.detach() for t in make(12)]
    full, _ = causal_conv1d(x[None], weight, bias)
    head, state = causal_conv1d(x[None, :2], weight, bias, output_final_state=True)  # shorter than the kernel
    middle, state = causal_conv1d(x[None, 2:7], weight, bias, initial_state=state, output_final_state=True)
    steps = []
    for t in range(7, 12):
        y_t, returned = causal_conv1d_update(x[None, t], state, weight, bias)
        assert returned is state, "the decode state is updated in place, as fla does"
        steps.append(y_t)
    torch.testing.assert_close(torch.cat([head[0], middle[0], torch.cat(steps)]), full[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(state, x[8:12].t().unsqueeze(0), rtol=0, atol=0)


def test_update_accepts_one_token_rows_and_keeps_dtype():
    x, weight, _, state = [t.detach() for t in make(3, num_seqs=3)]
    y2, _ = causal_conv1d_update(x.float(), state.float().clone(), weight.float())
    y3, _ = causal_conv1d_update(x.float()[:, None], state.float().clone(), weight.float())
    assert y2.shape == (3, 5) and y3.shape == (3, 1, 5) and y2.dtype == torch.float32
    torch.testing.assert_close(y3[:, 0], y2)


def test_bf16_conv_is_close_to_fp64():
    x, weight, bias, _ = [t.detach() for t in make(20)]
    y, _ = causal_conv1d(x[None].bfloat16(), weight.bfloat16(), bias.bfloat16())
    ref, _ = causal_conv1d(x[None], weight, bias)
    assert y.dtype == torch.bfloat16
    assert (y.double() - ref).abs().max() < 0.05 * ref.abs().max()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda x, w, s: causal_conv1d(x, w[:3]), "weight must have shape"),
        (lambda x, w, s: causal_conv1d(x[0], w), r"x must have shape \[B, T, D\]"),
        (lambda x, w, s: causal_conv1d(x, w, activation="relu"), "activation"),
        (lambda x, w, s: causal_conv1d(x, w, bias=w[:, 0][:2]), "bias must have shape"),
        (lambda x, w, s: causal_conv1d(x, w, initial_state=s[..., :2]), "initial_state must have shape"),
        (lambda x, w, s: causal_conv1d(x.expand(2, -1, -1), w, cu_seqlens=torch.tensor([0, 6])), "batch size"),
        (lambda x, w, s: causal_conv1d(x, w, cu_seqlens=torch.tensor([0, 7])), "end at the sequence length 6"),
        (lambda x, w, s: causal_conv1d_update(x, s, w), "one token per sequence"),
        (lambda x, w, s: causal_conv1d_update(x[:, 0], s[..., :3], w), "conv_state must have shape"),
    ],
)
def test_invalid_inputs_raise(call, message):
    x, weight, _, state = [t.detach() for t in make(6)]
    with pytest.raises(ValueError, match=message):
        call(x[None], weight, state)

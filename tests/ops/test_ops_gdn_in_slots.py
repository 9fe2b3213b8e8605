"""The slot-indexed ops (decode step, prompt chunks, conv windows) against fp64 references."""

import pytest
import torch
import torch.nn.functional as F

from llamafactory_zebra.kernels import Call, Op, decider, detect_stack, select
from llamafactory_zebra.kernels.switches import CPU_KERNELS_ENV_VAR
from llamafactory_zebra.ops import (
    causal_conv1d_in_slots,
    causal_conv1d_update_in_slots,
    chunk_gated_delta_rule_in_slots,
    fused_recurrent_gated_delta_rule_in_slots,
    naive_recurrent_gated_delta_rule,
)
from llamafactory_zebra.ops.cpu import cpu_prefill_in_slots
from llamafactory_zebra.ops.gated_delta_rule.chunk_prefill import chunk_gated_delta_rule_prefill


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


# Prompt chunks on slots: ``chunk_gated_delta_rule_in_slots``.


def packed_inputs(lengths, heads, key_dim, value_dim, dtype=torch.float64, seed=3):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(1, total, heads, key_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(1, total, heads, key_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(1, total, heads, value_dim, generator=gen, dtype=torch.float64)
    g = F.logsigmoid(torch.randn(1, total, heads, generator=gen, dtype=torch.float64) + 2.0)
    beta = torch.rand(1, total, heads, generator=gen, dtype=torch.float64)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    return [t.to(dtype) for t in (q, k, v, g, beta)], cu_seqlens


def reference_segments(inputs, cu_seqlens, start_states, has_initial_state):
    """Each segment alone through the fp64 naive rule, from its start state or zeros: ``o`` and final states."""
    outputs, finals = [], []
    for i, (start, end) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True)):
        start_state = start_states[i][None].double() if has_initial_state[i] else None
        o, final = naive_recurrent_gated_delta_rule(
            *(t[:, start:end].double() for t in inputs), initial_state=start_state, output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        outputs.append(o)
        finals.append(final[0])
    return torch.cat(outputs, dim=1), torch.stack(finals)


@pytest.mark.parametrize(
    ("lengths", "heads", "key_dim", "value_dim", "has_initial_state"),
    [
        ([1, 70, 5], 2, 8, 6, [True, False, True]),
        ([5, 65, 200, 1, 128], 1, 33, 7, [False, True, False, True, True]),  # odd heads, two whole chunks
    ],
)
@pytest.mark.parametrize("value_major", [False, True])
def test_chunk_on_slots_runs_each_segment_from_its_slot_or_zeros(
    lengths, heads, key_dim, value_dim, has_initial_state, value_major
):
    """Each segment equals the fp64 reference run alone, from its slot's state or from zeros, writes its final
    state to its slot and leaves the other slots alone."""
    inputs, cu_seqlens = packed_inputs(lengths, heads, key_dim, value_dim)
    cache = cache_of(len(lengths) + 3, heads, key_dim, value_dim, value_major, torch.float64)
    before = cache.clone()
    slots = torch.randperm(len(lengths) + 3, generator=torch.Generator().manual_seed(2))[: len(lengths)]
    has_initial_state = torch.tensor(has_initial_state)

    o = chunk_gated_delta_rule_in_slots(
        *inputs, cache, slots, cu_seqlens, has_initial_state, use_qk_l2norm_in_kernel=True
    )

    expected_o, expected_states = reference_segments(inputs, cu_seqlens, before[slots], has_initial_state)
    torch.testing.assert_close(o, expected_o, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(cache[slots], expected_states, atol=1e-10, rtol=1e-10)
    untouched = [i for i in range(cache.shape[0]) if i not in slots.tolist()]
    assert torch.equal(cache[untouched], before[untouched])


def test_prefill_with_bf16_operands_stays_within_bf16_noise():
    """bf16 inputs: the prefill op's bf16-operand path (``chunk_prefill.py``) errs against the fp64 run on the
    fp64 inputs by a small multiple of what bf16 inputs alone cost its exact path (uneven segments, states
    continued from slots)."""
    lengths, has_initial_state = [5, 65, 200, 1, 128], torch.tensor([False, True, False, True, True])
    inputs, cu_seqlens = packed_inputs(lengths, 2, 32, 64)
    cache = 0.3 * cache_of(len(lengths) + 3, 2, 32, 64, True, torch.float32)
    slots = torch.tensor([6, 0, 3, 7, 2])
    expected_o, expected_states = reference_segments(inputs, cu_seqlens, cache[slots], has_initial_state)
    half = [t.bfloat16() for t in inputs]
    errors = {}
    for name, matmul_dtype in (("exact", None), ("bf16", torch.bfloat16)):
        run_cache = cache.clone()
        o = chunk_gated_delta_rule_prefill(
            *half, run_cache, slots, cu_seqlens, has_initial_state, use_qk_l2norm_in_kernel=True,
            matmul_dtype=matmul_dtype,
        )  # fmt: skip
        assert o.dtype == torch.bfloat16 and run_cache.dtype == torch.float32
        errors[name] = [(o.double() - expected_o).abs(), (run_cache[slots].double() - expected_states).abs()]
    for index, what in enumerate(("output", "final state")):
        exact, bf16 = errors["exact"][index], errors["bf16"][index]
        summary = (
            f"{what}: bf16 operands mean {bf16.mean():.2e} max {bf16.max():.2e}; "
            f"exact mean {exact.mean():.2e} max {exact.max():.2e}"
        )
        assert 0 < exact.mean() and bf16.mean() <= 2 * exact.mean(), summary
        assert bf16.max() <= 3 * exact.max(), summary


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("lengths", "heads", "key_dim", "value_dim"), [([5, 65, 200, 1, 128], 3, 33, 7), ([64, 3], 2, 256, 512)]
)
def test_prefill_cpu_kernel_agrees_with_its_pytorch_path(lengths, heads, key_dim, value_dim, threads):
    """The C++ prefill (``cpu_prefill.cpp``) against the prefill op's PyTorch path, fp32 and bf16 inputs, exact
    and bf16 operands, states continued from scattered slots of a ``[slots, H, V, K]`` cache, other slots
    untouched; the exact fp32 run also against the fp64 reference."""
    has_initial_state = torch.tensor([i % 2 == 1 for i in range(len(lengths))])
    inputs, cu_seqlens = packed_inputs(lengths, heads, key_dim, value_dim)
    storage = 0.3 * cache_of(len(lengths) + 3, heads, key_dim, value_dim, True, torch.float32)
    slots = torch.randperm(len(lengths) + 3, generator=torch.Generator().manual_seed(4))[: len(lengths)]
    expected_o, expected_states = reference_segments(inputs, cu_seqlens, storage[slots], has_initial_state)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for dtype, bf16_operands in ((torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)):
            arguments = (slots, cu_seqlens, has_initial_state)
            kernel_cache, torch_cache = storage.clone(), storage.clone()
            o_kernel = cpu_prefill_in_slots(
                *(t.to(dtype) for t in inputs), kernel_cache, *arguments, use_qk_l2norm_in_kernel=True,
                bf16_operands=bf16_operands,
            )  # fmt: skip
            o_torch = chunk_gated_delta_rule_prefill(
                *(t.to(dtype) for t in inputs), torch_cache, *arguments, use_qk_l2norm_in_kernel=True,
                matmul_dtype=torch.bfloat16 if bf16_operands else None,
            )  # fmt: skip
            assert o_kernel.dtype == dtype
            tolerance = 1e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(o_kernel.float(), o_torch.float(), rtol=tolerance, atol=tolerance)
            torch.testing.assert_close(kernel_cache, torch_cache, rtol=tolerance, atol=tolerance)
            untouched = [i for i in range(storage.shape[0]) if i not in slots.tolist()]
            assert torch.equal(kernel_cache[untouched], storage[untouched])
            if dtype == torch.float32:
                torch.testing.assert_close(o_kernel.double(), expected_o, rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(kernel_cache[slots].double(), expected_states, rtol=1e-4, atol=1e-4)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize(
    ("case", "dtype", "state_dtype", "expected"),
    [
        ("fp32", torch.float32, torch.float32, "cpp"),
        ("bf16", torch.bfloat16, torch.float32, "cpp-bf16-gemm"),
        ("fp64", torch.float64, torch.float64, "torch"),
        ("bf16 state", torch.bfloat16, torch.bfloat16, "torch-bf16-gemm"),
        ("ZEBRA_CPU_KERNELS=torch", torch.bfloat16, torch.float32, "torch-bf16-gemm"),
    ],
)
def test_prefill_on_this_cpu_runs_what_the_registry_names(monkeypatch, case, dtype, state_dtype, expected):
    """On this machine (a compiler; bf16 operands only where the CPU has bf16 dot products, else the same path
    with fp32 operands): fp32 and bf16 inputs on an fp32 state take the C++ prefill; fp64 inputs, a bf16 state and
    ``ZEBRA_CPU_KERNELS=torch`` keep the PyTorch path. The choice is the registry's (``select``) and the op runs it."""
    if not detect_stack().cpu_bf16_dot_products:
        expected = expected.removesuffix("-bf16-gemm")
    if case == "ZEBRA_CPU_KERNELS=torch":
        monkeypatch.setenv(CPU_KERNELS_ENV_VAR, "torch")
    calls = []
    implementation = decider.implementation

    def recorded(kernel, point):
        function = implementation(kernel, point)
        return lambda *a, **k: calls.append(kernel.key) or function(*a, **k)

    monkeypatch.setattr(decider, "implementation", recorded)
    inputs, cu_seqlens = packed_inputs([3, 4], 1, 4, 4)
    cache = torch.zeros(2, 1, 4, 4, dtype=state_dtype)
    fresh = torch.tensor([False, False])
    chunk_gated_delta_rule_in_slots(*(t.to(dtype) for t in inputs), cache, torch.tensor([0, 1]), cu_seqlens, fresh)
    assert calls == [expected]
    call = Call.of(inputs[0].to(dtype), state_dtype=state_dtype)
    assert select(Op.GDN_PREFILL_IN_SLOTS, call).kernel.key == expected


def test_prefill_refuses_other_operand_dtypes():
    inputs, cu_seqlens = packed_inputs([3], 1, 4, 4)
    with pytest.raises(ValueError, match="matmul_dtype must be None or torch.bfloat16"):
        chunk_gated_delta_rule_prefill(
            *inputs, torch.zeros(1, 1, 4, 4), torch.tensor([0]), cu_seqlens, torch.tensor([False]),
            matmul_dtype=torch.float16,
        )  # fmt: skip


def test_chunk_on_slots_bad_arguments_are_named():
    (q, k, v, g, beta), cu_seqlens = packed_inputs([2, 3], 2, 4, 3, dtype=torch.float32)
    cache = torch.zeros(3, 2, 4, 3)
    fresh = torch.tensor([False, False])
    with pytest.raises(ValueError, match="state_indices must be distinct"):
        chunk_gated_delta_rule_in_slots(q, k, v, g, beta, cache, torch.tensor([1, 1]), cu_seqlens, fresh)
    with pytest.raises(ValueError, match=r"state_indices must have shape \[N\] = \[2\]"):
        chunk_gated_delta_rule_in_slots(q, k, v, g, beta, cache, torch.tensor([1]), cu_seqlens, fresh)
    with pytest.raises(ValueError, match="has_initial_state must be a bool tensor"):
        chunk_gated_delta_rule_in_slots(q, k, v, g, beta, cache, torch.tensor([0, 1]), cu_seqlens, torch.ones(2))
    with pytest.raises(ValueError, match="cu_seqlens is required"):
        chunk_gated_delta_rule_in_slots(q, k, v, g, beta, cache, torch.tensor([0, 1]), None, fresh)


# Conv windows on slots: ``causal_conv1d_in_slots`` / ``causal_conv1d_update_in_slots``.


def test_conv_on_slots_continues_each_window_and_leaves_other_slots_alone():
    """Each segment equals the conv over its slot's W - 1 inputs (zeros for a fresh one) followed by its
    tokens; the slot then holds the segment's last W - 1 inputs (history included for short segments)."""
    channels, width, lengths = 5, 4, [1, 2, 9]
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, sum(lengths), channels, generator=gen, dtype=torch.float64)
    weight = torch.randn(channels, width, generator=gen, dtype=torch.float64)
    storage = torch.randn(5, width - 1, channels, generator=gen, dtype=torch.float64)
    cache = storage.transpose(1, 2)  # vLLM's [slots, W - 1, C] storage, read as [slots, C, W - 1]
    before = cache.clone()
    slots, has_initial_state = torch.tensor([3, 0, 4]), torch.tensor([True, True, False])
    cu_seqlens = torch.tensor([0, 1, 3, 12])

    y = causal_conv1d_in_slots(x, weight, cache, slots, cu_seqlens, has_initial_state)

    for i, (start, end) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True)):
        history = before[slots[i]].t() if has_initial_state[i] else torch.zeros(width - 1, channels, dtype=x.dtype)
        stream = torch.cat([history, x[0, start:end]])  # [W - 1 + L, C]
        windows = stream.unfold(0, width, 1)  # [L, C, W]
        torch.testing.assert_close(y[0, start:end], F.silu((windows * weight).sum(-1)), atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(cache[slots[i]], stream[-(width - 1) :].t(), atol=0, rtol=0)
    assert torch.equal(cache[[1, 2]], before[[1, 2]])

    token = torch.randn(3, channels, generator=gen, dtype=torch.float64)
    windows = torch.cat([cache[slots], token[..., None]], dim=-1)
    y_step = causal_conv1d_update_in_slots(token, weight, cache, slots)
    torch.testing.assert_close(y_step, F.silu((windows * weight).sum(-1)), atol=1e-12, rtol=1e-12)
    assert torch.equal(cache[slots], windows[..., 1:])
    assert torch.equal(cache[[1, 2]], before[[1, 2]])


def test_conv_on_slots_names_a_cache_of_the_wrong_width():
    x, weight = torch.randn(2, 5), torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"conv_cache must have shape \[slots, D, W - 1\]"):
        causal_conv1d_update_in_slots(x, weight, torch.zeros(3, 5, 4), torch.tensor([0, 1]))


@pytest.mark.parametrize(
    ("features", "compiler", "expected"),
    [
        (frozenset({"avx512_bf16"}), "c++", "cpp-bf16-gemm"),
        (frozenset(), "c++", "cpp"),
        (frozenset({"avx512_bf16"}), None, "torch-bf16-gemm"),
        (frozenset(), None, "torch"),
    ],
)
def test_bf16_operands_only_where_the_cpu_has_bf16_dot_products(features, compiler, expected):
    """bf16 prompt chunks take bf16 GEMM operands only on a CPU with bf16 dot products (AVX-512-BF16, AMX, Arm
    bf16), and the C++ prefill only where a compiler can build it; fp32 inputs never take bf16 operands."""
    import dataclasses

    from llamafactory_zebra.kernels import this_machine

    stack = dataclasses.replace(this_machine(), cpu_features=features, compiler=compiler, faked=True)
    bf16_call = Call.on("cpu", torch.bfloat16, state_dtype=torch.float32)
    fp32_call = Call.on("cpu", torch.float32, state_dtype=torch.float32)
    assert select(Op.GDN_PREFILL_IN_SLOTS, bf16_call, stack).kernel.key == expected
    assert select(Op.GDN_PREFILL_IN_SLOTS, fp32_call, stack).kernel.key == ("cpp" if compiler else "torch")

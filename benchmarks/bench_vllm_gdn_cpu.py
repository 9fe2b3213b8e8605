"""The vLLM Zebra GDN layer's CPU pieces against what they replaced, at Zebra's GDN shapes, in one run.

1. Decode step, batch N: ``ops.fused_recurrent_gated_delta_rule_in_slots`` (each fp32 SSM slot stepped in
   place) with its C++ step (``ops/cpu/cpu_step.py``, the default where it builds) and with
   its PyTorch step (``ZEBRA_CPU_KERNELS=torch``), against the gather → ``fused_recurrent_gated_delta_rule_torch``
   → scatter path the layer used before, on a cache of N + 16 slots with the requests in random slots.
2. Prefill conv over 4096 tokens (16 requests of 256): vLLM's C++ ``causal_conv1d_fwd_cpu`` (bf16, on the
   slots) against this project's PyTorch ``causal_conv1d`` (gathered states), with their largest difference.
3. Prefill chunked GDN on state slots (one 512-token vLLM step of 2 requests of 256, and one 2048-token
   request), bf16 inputs: the C++ prefill (``cpu_prefill.cpp``, what the layer runs on a CPU) and its PyTorch
   path (``chunk_prefill.py``), each exact (fp32 GEMMs) and with bf16 GEMM operands (what the layer runs for
   bf16 serving on CPUs with bf16 dot products), each with its mean and largest difference from the fp64 run
   on the same (bf16-rounded) inputs.
4. The gated RMSNorm that closes the layer, bf16, over 2048 tokens of 6 heads x 512 values: the package's
   one-pass C++ op (``ops.gated_rms_norm``, what the layer runs eagerly on a CPU) against vLLM's
   ``RMSNormGated`` in PyTorch (what ran before), with their largest difference.

One thread (vLLM's CPU worker computes on one). Run it in the vLLM venv (``scripts/vllm_env.sh``):

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/bench_vllm_gdn_cpu.py
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import time

import torch

from llamafactory_zebra.kernels.switches import CPU_KERNELS_ENV_VAR
from llamafactory_zebra.ops import (
    causal_conv1d,
    cpu_kernels,
    fused_recurrent_gated_delta_rule_in_slots,
    fused_recurrent_gated_delta_rule_torch,
    gated_rms_norm,
)
from llamafactory_zebra.ops.cpu import cpu_prefill_in_slots
from llamafactory_zebra.ops.gated_delta_rule.chunk_prefill import chunk_gated_delta_rule_prefill

HEADS, KEY, VALUE, WIDTH = 6, 256, 512, 4  # the released GDN layer: 6 heads, key 256, value 512, conv 4


def best_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times) * 1000


def gather_step(q, k, v, g, beta, cache, slots):
    """The earlier decode path: gather the slots, step the batch, scatter the new states back."""
    o, final = fused_recurrent_gated_delta_rule_torch(
        q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
        initial_state=cache[slots].float(), output_final_state=True, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    cache[slots] = final
    return o[:, 0]


@contextlib.contextmanager
def torch_step():
    """The decode op's PyTorch step instead of its C++ one (``ZEBRA_CPU_KERNELS=torch``)."""
    os.environ[CPU_KERNELS_ENV_VAR] = "torch"
    try:
        yield
    finally:
        del os.environ[CPU_KERNELS_ENV_VAR]


def decode_rows(batches: list[int], repeats: int) -> list[str]:
    rows = []
    for batch in batches:
        generator = torch.Generator().manual_seed(batch)
        q, k = (torch.randn(batch, HEADS, KEY, generator=generator, dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(batch, HEADS, VALUE, generator=generator, dtype=torch.bfloat16)
        g = -torch.rand(batch, HEADS, generator=generator)
        beta = torch.rand(batch, HEADS, generator=generator, dtype=torch.bfloat16)
        cache = torch.randn(batch + 16, HEADS, KEY, VALUE, generator=generator) * 0.01
        slots = torch.randperm(batch + 16, generator=generator)[:batch]
        inputs = (q, k, v, g, beta)
        reference_cache, ours_cache, torch_step_cache = cache.clone(), cache.clone(), cache.clone()
        expected = gather_step(*inputs, reference_cache, slots)
        actual = fused_recurrent_gated_delta_rule_in_slots(*inputs, ours_cache, slots, use_qk_l2norm_in_kernel=True)
        error = max(
            (expected.float() - actual.float()).abs().max().item(), (reference_cache - ours_cache).abs().max().item()
        )
        with torch_step():
            torch_actual = fused_recurrent_gated_delta_rule_in_slots(
                *inputs, torch_step_cache, slots, use_qk_l2norm_in_kernel=True
            )
        torch_error = max(
            (torch_actual.float() - actual.float()).abs().max().item(),
            (torch_step_cache - ours_cache).abs().max().item(),
        )

        def before(inputs=inputs, cache=cache, slots=slots):
            return gather_step(*inputs, cache, slots)

        def after(inputs=inputs, cache=cache, slots=slots):
            return fused_recurrent_gated_delta_rule_in_slots(*inputs, cache, slots, use_qk_l2norm_in_kernel=True)

        old, new = best_ms(before, repeats), best_ms(after, repeats)
        with torch_step():
            in_torch = best_ms(after, repeats)
        rows.append(
            f"| {batch} | {old:.1f} | {in_torch:.1f} | {new:.1f} | {in_torch / new:.1f}x | {old / new:.1f}x "
            f"| {error:.1e} | {torch_error:.1e} |"
        )
    return rows


def conv_row(repeats: int) -> str:
    from vllm import _custom_ops as vllm_ops

    requests, tokens = 16, 4096
    channels = HEADS * (2 * KEY + VALUE)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, channels, generator=generator).bfloat16()
    weight = (torch.randn(channels, WIDTH, generator=generator) * 0.3).bfloat16()
    starts = torch.arange(0, tokens + 1, tokens // requests)
    storage = torch.zeros(requests, WIDTH - 1, channels, dtype=torch.bfloat16)  # vLLM's [slots, W - 1, C]
    slots = torch.arange(requests, dtype=torch.int32)
    fresh = torch.zeros(requests, dtype=torch.bool)

    def vllm_conv():
        return vllm_ops.causal_conv1d_fwd_cpu(
            x=x.transpose(0, 1), weight=weight, bias=None, conv_states=storage.transpose(1, 2),
            query_start_loc=starts.to(torch.int32), cache_indices=slots, has_initial_state=fresh,
            silu_activation=True, is_weight_packed=False,
        ).transpose(0, 1)  # fmt: skip

    def torch_conv():
        state = torch.zeros(requests, channels, WIDTH, dtype=torch.bfloat16)
        return causal_conv1d(
            x[None], weight, activation="silu", initial_state=state, output_final_state=True, cu_seqlens=starts
        )[0][0]

    error = (vllm_conv().float() - torch_conv().float()).abs().max().item()
    old, new = best_ms(torch_conv, repeats), best_ms(vllm_conv, repeats)
    return f"| {tokens} tokens, {requests} requests, {channels} channels | {old:.0f} | {new:.0f} | {old / new:.1f}x | {error:.1e} |"


def prompt_chunk(requests: int, tokens: int) -> tuple[torch.Generator, tuple[torch.Tensor, ...], torch.Tensor]:
    """A bf16 prompt chunk of ``requests`` equal sequences at the GDN layer's shapes (g in fp32, as the layer
    passes it), their borders, and the generator for anything else the row draws."""
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, tokens, HEADS, KEY, generator=generator).bfloat16() for _ in range(2))
    v = torch.randn(1, tokens, HEADS, VALUE, generator=generator).bfloat16()
    g = -torch.rand(1, tokens, HEADS, generator=generator) * 0.1
    beta = torch.rand(1, tokens, HEADS, generator=generator).bfloat16()
    return generator, (q, k, v, g, beta), torch.arange(0, tokens + 1, tokens // requests)


def chunk_row(requests: int, tokens: int, repeats: int) -> str:
    generator, (q, k, v, g, beta), starts = prompt_chunk(requests, tokens)
    slots, fresh = torch.arange(requests), torch.zeros(requests, dtype=torch.bool)

    def run(path: str, bf16_operands: bool, inputs=(q, k, v, g, beta)):
        cache = torch.zeros(requests, HEADS, VALUE, KEY).transpose(-1, -2)  # vLLM's [slots, H, V, K]
        if path == "cpp":
            return cpu_prefill_in_slots(
                *inputs, cache, slots, starts, fresh, use_qk_l2norm_in_kernel=True, bf16_operands=bf16_operands
            )
        return chunk_gated_delta_rule_prefill(
            *inputs, cache, slots, starts, fresh, use_qk_l2norm_in_kernel=True,
            matmul_dtype=torch.bfloat16 if bf16_operands else None,
        )  # fmt: skip

    exact = run("torch", False, tuple(t.double() for t in (q, k, v, g, beta)))
    cells = []
    for path, bf16_operands in (("torch", False), ("torch", True), ("cpp", False), ("cpp", True)):
        difference = (run(path, bf16_operands).double() - exact).abs()
        ms = best_ms(functools.partial(run, path, bf16_operands), repeats)
        cells.append((ms, difference.mean().item(), difference.max().item()))
    times = " | ".join(f"{ms:.1f}" for ms, _, _ in cells)
    errors = " | ".join(f"{mean:.1e} / {largest:.1e}" for _, mean, largest in cells)
    return f"| {tokens} tokens, {requests} request(s) | {times} | {cells[1][0] / cells[3][0]:.1f}x | {errors} |"


def norm_row(repeats: int) -> str:
    from vllm.model_executor.layers.layernorm import RMSNormGated

    tokens, eps = 2048, 1e-6
    generator = torch.Generator().manual_seed(0)
    x, gate = (torch.randn(tokens, HEADS, VALUE, generator=generator).bfloat16() for _ in range(2))
    weight = 1 + 0.1 * torch.randn(VALUE, generator=generator)

    def vllm_norm():
        return RMSNormGated.forward_static(x, gate, weight, eps, x.dtype)

    error = (vllm_norm().float() - gated_rms_norm(x, gate, weight, eps).float()).abs().max().item()
    old, new = best_ms(vllm_norm, repeats), best_ms(lambda: gated_rms_norm(x, gate, weight, eps), repeats)
    return f"| {tokens} tokens x {HEADS} heads x {VALUE} | {old:.1f} | {new:.1f} | {old / new:.1f}x | {error:.1e} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cpu_kernels()  # builds, or raises naming why (this benchmark times the C++ kernels)
    print(f"GDN decode step, one layer ({HEADS} heads, key {KEY}, value {VALUE}, fp32 state; bf16 activations)")
    print(
        "| batch | gather + step + scatter ms | in place, PyTorch step ms | in place, C++ step ms "
        "| C++ / PyTorch speed-up | C++ / gather speed-up | max abs difference, C++ vs gather "
        "| max abs difference, C++ vs PyTorch step |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(decode_rows(args.batches, args.repeats)))
    print("\nPrefill causal conv, one layer (bf16)")
    print("| input | project PyTorch conv ms | vLLM C++ conv ms | speed-up | max abs difference |")
    print("|---|---:|---:|---:|---:|")
    print(conv_row(args.repeats))
    print("\nPrefill chunked gated delta rule on state slots, one layer (bf16 inputs, fp32 state)")
    print(
        "| input | PyTorch, fp32 GEMMs ms | PyTorch, bf16 GEMM operands ms | C++, fp32 GEMMs ms "
        "| C++, bf16 GEMM operands ms | C++ / PyTorch (bf16 operands) | mean / max abs error vs fp64: PyTorch fp32 "
        "| PyTorch bf16 | C++ fp32 | C++ bf16 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(chunk_row(2, 512, args.repeats))
    print(chunk_row(1, 2048, args.repeats))
    print("\nGated RMSNorm closing the layer, bf16")
    print("| input | vLLM RMSNormGated (PyTorch) ms | ops.gated_rms_norm (C++) ms | speed-up | max abs difference |")
    print("|---|---:|---:|---:|---:|")
    print(norm_row(args.repeats))


if __name__ == "__main__":
    main()

"""gpu_check's latent-decode row: the Triton latent MLA decode against the plain reference, and its speed.

At the released 7MLA21GDN head shapes (``testing/latent_cache.RELEASED``: 16 query heads, 8 key heads,
latent 256 + rope 64 + 8 scales), a batch of requests of mixed lengths in a paged cache (block 16 and a
hybrid-sized block of 4,864 tokens, pages shuffled): ``ops.latent_attention.triton_decode`` in fp32 and
bf16 against ``reference.latent_decode_reference`` (fp32 math). PASS when the relative error is within
``FP32_TOLERANCE`` / ``BF16_TOLERANCE`` (the bounds the interpreter test holds it to,
``tests/ops/test_latent_attention_triton.py``). Then, bf16, ``TIMED_BATCH`` requests of ``TIMED_CONTEXT``
tokens: the Triton decode against sdpa over expanded GQA keys and values of the same length (what the
expanded layout's attention reads), CUDA-event times.

    python tools/gpu_check_latent.py                    # on the GPU machine (gpu_check.sh calls it)
    TRITON_INTERPRET=1 python tools/gpu_check_latent.py --cpu   # the same code, short lengths, fp32 only

``--cpu`` checks fp32 only: Triton's bare interpreter computes bf16 on raw bit patterns (the tests close
that gap with ``tests/helpers/triton_interpreter``, and hold the bf16 cases there).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from llamafactory_zebra.ops.latent_attention import latent_decode_reference
from llamafactory_zebra.ops.latent_attention.triton_decode import latent_decode_triton
from llamafactory_zebra.testing.latent_cache import RELEASED, make_problem

FP32_TOLERANCE = 1e-5
BF16_TOLERANCE = 1e-2
GPU_LENGTHS = [1, 17, 4_865, 16_384]
CPU_LENGTHS = [1, 17, 70]
TIMED_BATCH, TIMED_CONTEXT = 16, 16_384


def parity(lengths: list[int], block_size: int, dtype: torch.dtype, device: str) -> float:
    s = RELEASED
    problem = make_problem(s, lengths, block_size, dtype=dtype, device=device)
    gen = torch.Generator().manual_seed(3)
    query = 2 * torch.randn(len(lengths), s.heads, s.nope_dim + s.rope_dim, generator=gen, dtype=torch.float64)
    q_latent, q_rope = problem.absorb(query.to(device))
    inputs = (q_latent.to(dtype).contiguous(), q_rope.to(dtype).contiguous(), problem.cache, problem.block_table)
    inputs += (problem.seq_lens, (s.nope_dim + s.rope_dim) ** -0.5, s.kv_heads, s.scales_offset)
    out = latent_decode_triton(*inputs)
    expected = latent_decode_reference(*inputs)
    return float((out.double() - expected.double()).norm() / expected.double().norm())


def timed_ms(fn, repeats: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def speed(device: str) -> str:
    s, dtype = RELEASED, torch.bfloat16
    problem = make_problem(s, [TIMED_CONTEXT] * TIMED_BATCH, 16, dtype=dtype, fill=0.0, device=device)
    q_latent = torch.randn(TIMED_BATCH, s.heads, s.latent_dim, device=device, dtype=dtype)
    q_rope = torch.randn(TIMED_BATCH, s.heads, s.rope_dim, device=device, dtype=dtype)
    scale = (s.nope_dim + s.rope_dim) ** -0.5
    inputs = (q_latent, q_rope, problem.cache, problem.block_table, problem.seq_lens, scale, s.kv_heads)
    latent_ms = timed_ms(lambda: latent_decode_triton(*inputs, s.scales_offset))
    del problem
    query = torch.randn(TIMED_BATCH, s.heads, 1, s.nope_dim + s.rope_dim, device=device, dtype=dtype)
    keys = torch.randn(TIMED_BATCH, s.kv_heads, TIMED_CONTEXT, s.nope_dim + s.rope_dim, device=device, dtype=dtype)
    values = torch.randn(TIMED_BATCH, s.kv_heads, TIMED_CONTEXT, s.v_dim, device=device, dtype=dtype)
    expanded_ms = timed_ms(lambda: F.scaled_dot_product_attention(query, keys, values, scale=scale, enable_gqa=True))
    return (
        f"bf16 decode, {TIMED_BATCH} x {TIMED_CONTEXT:,} tokens: Triton latent {latent_ms:.3f} ms, "
        f"sdpa over expanded K/V {expanded_ms:.3f} ms ({latent_ms / expanded_ms:.2f}x)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="under TRITON_INTERPRET=1: short lengths, fp32, no timing")
    args = parser.parse_args(argv)
    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check_latent: no CUDA/ROCm GPU visible to torch (use --cpu under TRITON_INTERPRET=1)")
    started = time.perf_counter()
    try:
        result, detail, passed = check(args.cpu, device)
    except Exception as error:  # the row says what failed, as gpu_check.py's rows do
        result, detail, passed = "ERROR", f"{type(error).__name__}: {str(error).splitlines()[0][:300]}", None
    print(f"| latent decode (Triton) | {result} | {detail} | {time.perf_counter() - started:.1f} |", flush=True)
    return 0 if passed else 1 if passed is False else 2


def check(cpu: bool, device: str) -> tuple[str, str, bool]:
    """The row's result, detail and verdict."""
    lengths = CPU_LENGTHS if cpu else GPU_LENGTHS
    dtypes = {"fp32": (torch.float32, FP32_TOLERANCE)}
    if not cpu:
        dtypes["bf16"] = (torch.bfloat16, BF16_TOLERANCE)
    worst = {
        name: max(parity(lengths, block, dtype, device) for block in (16, 4_864))
        for name, (dtype, _) in dtypes.items()
    }
    passed = all(worst[name] < tolerance for name, (_, tolerance) in dtypes.items())
    result = f"{'PASS' if passed else 'FAIL'}: " + ", ".join(
        f"{name} {worst[name]:.1e} (< {tolerance:g})" for name, (_, tolerance) in dtypes.items()
    )
    detail = f"released shapes, lengths {lengths}, blocks 16 and 4,864, vs the PyTorch reference"
    if device == "cuda":
        detail += "; " + speed(device)
    return result, detail, passed


if __name__ == "__main__":
    sys.exit(main())

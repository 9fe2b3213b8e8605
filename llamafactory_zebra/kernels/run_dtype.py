"""The dtype a Zebra run computes in when its user did not name one: the one decision, for every caller.

bf16 where it runs natively — a GPU, or a CPU with bf16 dot products (AVX-512-BF16, AMX or Arm's bf16
extension: :attr:`~.stack.Stack.cpu_bf16_dot_products`) — and fp32 elsewhere: on such a CPU PyTorch (and
vLLM's CPU build, through the same oneDNN) emulates bf16 matrix multiplies, many times slower than fp32
(the measured cost: docs/benchmarks.md, "bf16 on a CPU without bf16 dot products"). A dtype the user
names always wins; the known issue ``cpu-bf16-without-dot-products`` (``known_issues.py``) then says what
it costs. ``verify --dtype auto`` and the serving benchmarks' ``--dtype auto`` ask :func:`run_dtype` (the
quickstarts train and serve in fp32 on every CPU; LLaMA-Factory's own ``infer_dtype: auto`` is fp32 on a CPU);
:func:`matmul_rates` measures what the rule assumes, for the benchmarks' tables and ``doctor``.
"""

from __future__ import annotations

import time

from .stack import Stack, detect_stack

AUTO, BF16, FP32 = "auto", "bfloat16", "float32"
DTYPES = (BF16, FP32)
# The probe's GEMM: a 2,048-token prompt chunk through a 512-wide projection to 1,536 (the serving benchmark's
# MLP shape). ``doctor`` runs a quarter of the rows: on a CPU that emulates bf16 it is ~1 GFLOP/s.
PROBE_SHAPE = (2048, 512, 1536)


def run_dtype(requested: str = AUTO, stack: Stack | None = None) -> str:
    """``requested`` when it names a dtype; for ``auto``, bf16 on a GPU or a CPU with bf16 dot products,
    fp32 elsewhere (``stack``: this machine, or ``ZEBRA_FAKE_STACK``'s)."""
    if requested != AUTO:
        if requested not in DTYPES:
            raise ValueError(f"dtype {requested!r} is not valid; use {AUTO}, {BF16} or {FP32}")
        return requested
    stack = stack or detect_stack()
    return BF16 if stack.has_gpu or stack.cpu_bf16_dot_products else FP32


def matmul_rates(shape: tuple[int, int, int] = PROBE_SHAPE, repeats: int = 3) -> dict[str, float]:
    """GFLOP/s of one ``m×k @ k×n`` matrix multiply on this CPU in bf16 and in fp32 (best of ``repeats``, after
    one warm-up each): the rate the dtype rule is about, measured on this machine (threads as torch has them)."""
    import torch

    m, k, n = shape
    rates = {}
    for name in DTYPES:
        dtype = getattr(torch, name)
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        torch.mm(a, b)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
        rates[name] = 2 * m * k * n / best / 1e9
    return rates


def describe_rates(rates: dict[str, float], shape: tuple[int, int, int] = PROBE_SHAPE) -> str:
    """One line for a table's caption or doctor: both rates and their ratio."""
    m, k, n = shape
    return (
        f"CPU matmul {m}x{k} @ {k}x{n}: bf16 {rates[BF16]:.1f} GFLOP/s, fp32 {rates[FP32]:.1f} GFLOP/s "
        f"(bf16/fp32 {rates[BF16] / rates[FP32]:.2f})"
    )

"""Gated delta rule: this project's PyTorch path vs transformers' Qwen3-Next fallback (and fla on GPUs).

Times forward and forward+backward at the Zebra GDN layer's shapes (H=6, K=256, V=512, B=1, q/k
L2-normalised in the op as the layer does) and measures each implementation's error against the fp64
token-by-token reference at a short length. The baseline is
``transformers.models.qwen3_next.modeling_qwen3_next.torch_chunk_gated_delta_rule``; it takes the same
``[B, T, H, D]`` layout and normalises q/k itself when ``use_qk_l2norm_in_kernel=True``, and its scale is
fixed to ``K ** -0.5`` (our default), so every implementation gets identical tensors and flags.

Besides wall time (median of ``--repeats`` runs, implementations interleaved), the table reports the
process CPU time, which is less sensitive to other jobs on a shared machine.

    python benchmarks/bench_gdn.py --lengths 2048 8192 --repeats 3
    python benchmarks/bench_gdn.py --device cuda --lengths 2048 8192 32768   # adds fla when installed
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from llamafactory_zebra.ops import chunk_gated_delta_rule_torch, naive_recurrent_gated_delta_rule

HEADS, KEY_DIM, VALUE_DIM = 6, 256, 512
BASELINE = "transformers"
Impl = Callable[..., torch.Tensor]


def implementations(device: str) -> dict[str, Impl]:
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    impls: dict[str, Impl] = {
        BASELINE: lambda q, k, v, g, b: torch_chunk_gated_delta_rule(q, k, v, g, b, use_qk_l2norm_in_kernel=True)[0],
        "zebra-torch": lambda q, k, v, g, b: chunk_gated_delta_rule_torch(q, k, v, g, b, use_qk_l2norm_in_kernel=True)[
            0
        ],
    }
    if device == "cuda":
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
        except ImportError:
            print("fla not importable: no fla column", file=sys.stderr)
        else:
            impls["fla"] = lambda q, k, v, g, b: fla_chunk(q=q, k=k, v=v, g=g, beta=b, use_qk_l2norm_in_kernel=True)[0]
    return impls


def make_inputs(length: int, dtype: torch.dtype, device: str, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shape = (1, length, HEADS)
    q = torch.randn(*shape, KEY_DIM, generator=gen)
    k = torch.randn(*shape, KEY_DIM, generator=gen)
    v = torch.randn(*shape, VALUE_DIM, generator=gen)
    g = F.logsigmoid(torch.randn(*shape, generator=gen) + 3.0)  # per-token decay around exp(-0.05)
    beta = torch.randn(*shape, generator=gen).sigmoid()
    g = g.to(device=device, dtype=torch.float64 if dtype == torch.float64 else torch.float32)  # fp32 as in the layer
    return [*(t.to(device=device, dtype=dtype) for t in (q, k, v)), g, beta.to(device=device, dtype=dtype)]


class Meter:
    """Wall seconds and process CPU seconds of one timed block."""

    def __init__(self, device: str) -> None:
        self.device = device

    def __enter__(self) -> Meter:
        gc.collect()
        self._sync()
        self._cpu, self._wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self._sync()
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()


def time_one(impl: Impl, inputs: list[torch.Tensor], device: str) -> tuple[Meter, Meter]:
    with torch.no_grad(), Meter(device) as forward:
        impl(*inputs)
    leaves = [t.detach().requires_grad_() for t in inputs]
    with Meter(device) as both:
        out = impl(*leaves)
        out.backward(torch.ones_like(out))
    return forward, both


def accuracy(
    impls: dict[str, Impl], length: int, dtype: torch.dtype, device: str, seeds: int
) -> dict[str, tuple[float, float]]:
    """Max abs error of the output and of all input gradients against the fp64 reference.

    Taken as the worst case over ``seeds`` random inputs: single draws of fp32 rounding error differ
    by tens of percent between implementations of equal accuracy.
    """
    errors = {name: (0.0, 0.0) for name in impls}
    for seed in range(1, seeds + 1):
        base = make_inputs(length, torch.float64, "cpu", seed=seed)
        ref = [t.clone().requires_grad_() for t in base]
        o_ref, _ = naive_recurrent_gated_delta_rule(*ref, use_qk_l2norm_in_kernel=True)
        weight = torch.randn(o_ref.shape, generator=torch.Generator().manual_seed(1000 + seed), dtype=torch.float64)
        (o_ref * weight).sum().backward()
        for name, impl in impls.items():
            leaves = [
                t.to(device=device, dtype=torch.float32 if i == 3 else dtype, copy=True).requires_grad_()
                for i, t in enumerate(base)
            ]
            o = impl(*leaves)
            (o.double() * weight.to(device)).sum().backward()
            out_err = (o.double().cpu() - o_ref).abs().max().item()
            grad_err = max(
                (t.grad.double().cpu() - r.grad).abs().max().item() for t, r in zip(leaves, ref, strict=True)
            )
            errors[name] = (max(errors[name][0], out_err), max(errors[name][1], grad_err))
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per length and implementation (median)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--dtype", choices=["auto", "float32", "bfloat16"], default="auto", help="auto: fp32 on CPU, bf16 on CUDA"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--accuracy-length", type=int, default=256)
    parser.add_argument("--accuracy-seeds", type=int, default=3, help="report the worst error over this many inputs")
    parser.add_argument(
        "--impls", nargs="+", default=None, help=f"subset to run (default: all available; ratios need {BASELINE})"
    )
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = {
        "auto": torch.float32 if args.device == "cpu" else torch.bfloat16,
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
    }[args.dtype]
    impls = implementations(args.device)
    if args.impls:
        unknown = set(args.impls) - set(impls)
        if unknown:
            parser.error(f"unknown or unavailable --impls {sorted(unknown)}; available: {sorted(impls)}")
        impls = {name: impl for name, impl in impls.items() if name in args.impls}
    where = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine()
    print(
        f"# torch {torch.__version__}, {args.device} ({where}), {torch.get_num_threads()} threads, {dtype}, H={HEADS} K={KEY_DIM} V={VALUE_DIM} B=1"
    )
    print(f"# command: python benchmarks/bench_gdn.py {' '.join(argv if argv is not None else sys.argv[1:])}")

    errors = accuracy(impls, args.accuracy_length, dtype, args.device, args.accuracy_seeds)
    for impl in impls.values():  # warm-up: first-call costs (allocator, kernels, autotuning)
        time_one(impl, make_inputs(256, dtype, args.device), args.device)

    rows = []
    for length in args.lengths:
        inputs = make_inputs(length, dtype, args.device)
        runs: dict[str, list[tuple[Meter, Meter]]] = {name: [] for name in impls}
        for _ in range(args.repeats):
            for name, impl in impls.items():
                runs[name].append(time_one(impl, inputs, args.device))
                print(
                    f"  T={length} {name}: fwd {runs[name][-1][0].wall:.3f}s, fwd+bwd {runs[name][-1][1].wall:.3f}s",
                    file=sys.stderr,
                    flush=True,
                )
        medians = {
            name: [statistics.median(getattr(m[i], field) for m in ms) for i in (0, 1) for field in ("wall", "cpu")]
            for name, ms in runs.items()
        }
        for name in impls:
            rows.append((length, name, medians[name], medians.get(BASELINE)))

    print(
        f"\nAccuracy at T={args.accuracy_length} vs the fp64 token-by-token reference "
        f"(max abs error, worst of {args.accuracy_seeds} inputs):\n"
    )
    print("| implementation | output | gradients (q, k, v, g, beta) |")
    print("|---|---|---|")
    for name, (out_err, grad_err) in errors.items():
        print(f"| {name} | {out_err:.2e} | {grad_err:.2e} |")
    print(f"\nTimes: median of {args.repeats} runs; speedup = {BASELINE} time / this time (wall).\n")
    header = "| T | implementation | fwd wall s | fwd CPU s | fwd+bwd wall s | fwd+bwd CPU s | fwd speedup | fwd+bwd speedup |"
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for length, name, (fw, fc, bw, bc), base in rows:
        ratios = f"{base[0] / fw:.2f}x | {base[2] / bw:.2f}x" if base else "n/a | n/a"
        print(f"| {length} | {name} | {fw:.3f} | {fc:.2f} | {bw:.3f} | {bc:.2f} | {ratios} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

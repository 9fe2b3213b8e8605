"""The two PyTorch gated-delta-rule paths: today's CPU-tuned op against the GPU-shaped one, eager and compiled.

``chunk`` is ``chunk_gated_delta_rule_torch`` (``ops/gated_delta_rule/chunk.py``, the baseline of every
ratio); ``parallel`` is ``chunk_gated_delta_rule_parallel`` (``chunk_parallel.py``) in eager mode and
``parallel-compiled`` the same with ``compile=True``. Inputs are the Zebra GDN layer's shapes (H=6,
K=256, V=512, q/k L2-normalised in the op) packed into uneven segments with ``cu_seqlens``, fp32.

Per length the table gives forward+backward wall and process-CPU seconds (median of ``--repeats``,
implementations interleaved, compilation excluded by a warm-up at the same shapes) and the number of
ATen ops one forward and one forward+backward dispatch (counted below autograd, views excluded: each is
about one kernel launch on a GPU; eager paths only, a compiled graph is not counted op by op). A
second table counts ops for one length cut into more and more segments. Accuracy is the error of
output, final state and all input gradients against ``naive_recurrent_gated_delta_rule`` in fp64,
relative to each quantity's largest value, for fp64 inputs (exactness) and fp32 inputs (rounding), at
``--accuracy-length`` in three segments with initial states.

    python benchmarks/bench_gdn_torch_paths.py --lengths 2048 8192 --segments 4 8 --repeats 2 --threads 1
    python benchmarks/bench_gdn_torch_paths.py --device cuda --lengths 8192 32768 --segments 8 8   # on a GPU
"""

from __future__ import annotations

import argparse
import functools
import platform
import statistics
import sys
from collections import Counter
from collections.abc import Callable

import torch
from bench_gdn import HEADS, KEY_DIM, VALUE_DIM, Meter, make_inputs
from torch.utils._python_dispatch import TorchDispatchMode

from llamafactory_zebra.ops.gated_delta_rule import (
    chunk_gated_delta_rule_parallel,
    chunk_gated_delta_rule_torch,
    naive_recurrent_gated_delta_rule,
)

BASELINE = "chunk"
IMPLEMENTATIONS: dict[str, Callable] = {
    BASELINE: chunk_gated_delta_rule_torch,
    "parallel": chunk_gated_delta_rule_parallel,
    "parallel-compiled": functools.partial(chunk_gated_delta_rule_parallel, compile=True),
}


def packed_borders(length: int, segments: int) -> torch.Tensor:
    """``cu_seqlens`` cutting ``length`` into ``segments`` uneven parts (the first is the longest)."""
    weights = torch.arange(segments, 0, -1, dtype=torch.float64) + 0.5
    sizes = (weights / weights.sum() * length).floor().long().clamp(min=1)
    sizes[0] += length - sizes.sum()
    return torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])


def call(impl: Callable, inputs: list[torch.Tensor], cu_seqlens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v, g, beta = inputs[:5]
    h0 = inputs[5] if len(inputs) > 5 else None
    return impl(
        q,
        k,
        v,
        g,
        beta,
        initial_state=h0,
        output_final_state=True,
        cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=True,
    )


def forward_backward(impl: Callable, inputs: list[torch.Tensor], cu_seqlens: torch.Tensor) -> None:
    leaves = [t.detach().requires_grad_() for t in inputs]
    o, state = call(impl, leaves, cu_seqlens)
    (o.sum() + state.sum()).backward()


class OpCounter(TorchDispatchMode):
    """Counts the ATen ops dispatched below autograd, views (no kernel) excluded."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count_ops(impl: Callable, inputs: list[torch.Tensor], cu_seqlens: torch.Tensor) -> tuple[int, int]:
    """Ops of one no-grad forward and of one forward+backward."""
    with OpCounter() as forward, torch.no_grad():
        call(impl, inputs, cu_seqlens)
    with OpCounter() as both:
        forward_backward(impl, inputs, cu_seqlens)
    return sum(forward.counts.values()), sum(both.counts.values())


def accuracy(length: int, device: str) -> dict[str, dict[str, float]]:
    """Worst error of output, state and gradients vs the fp64 reference, for fp64 and fp32 inputs.

    Each quantity's max abs error is divided by its largest reference magnitude (the gradient of g
    is ~100x the output here), then the worst quantity is reported.
    """
    cu = packed_borders(length, 3)
    base = make_inputs(length, torch.float64, "cpu", seed=1)
    base.append(
        torch.randn(3, HEADS, KEY_DIM, VALUE_DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    )
    weights = [
        torch.randn(length, HEADS, VALUE_DIM, dtype=torch.float64)[None],
        torch.randn(3, HEADS, KEY_DIM, VALUE_DIM, dtype=torch.float64),
    ]

    def run(impl, dtype):
        where = "cpu" if impl is naive_recurrent_gated_delta_rule else device
        leaves = [t.detach().to(where, dtype, copy=True).requires_grad_() for t in base]
        o, state = call(impl, leaves, cu)
        ((o.double().cpu() * weights[0]).sum() + (state.double().cpu() * weights[1]).sum()).backward()
        return [x.double().cpu() for x in (o, state, *(t.grad for t in leaves))]

    reference = run(naive_recurrent_gated_delta_rule, torch.float64)
    errors: dict[str, dict[str, float]] = {}
    for name, impl in IMPLEMENTATIONS.items():
        for dtype in (torch.float64, torch.float32):
            got = run(impl, dtype)
            errors.setdefault(name, {})[str(dtype).removeprefix("torch.")] = max(
                ((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, reference, strict=True)
            )
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--segments", type=int, nargs="+", default=[4, 8], help="packed segments per length")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--accuracy-length", type=int, default=192)
    parser.add_argument("--scaling-length", type=int, default=8192)
    parser.add_argument("--scaling-segments", type=int, nargs="+", default=[1, 8, 64])
    args = parser.parse_args(argv)
    if len(args.segments) != len(args.lengths):
        parser.error("--segments takes one count per --lengths entry")
    if args.threads:
        torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine()
    print(
        f"# torch {torch.__version__}, {args.device} ({where}), "
        f"{torch.get_num_threads()} threads, fp32, H={HEADS} K={KEY_DIM} V={VALUE_DIM}"
    )
    print(
        f"# command: python benchmarks/bench_gdn_torch_paths.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    )

    errors = accuracy(args.accuracy_length, args.device)
    rows = []
    for length, segments in zip(args.lengths, args.segments, strict=True):
        cu = packed_borders(length, segments).to(args.device)
        inputs = make_inputs(length, torch.float32, args.device)
        for impl in IMPLEMENTATIONS.values():  # warm-up at these shapes: compilation is not timed
            forward_backward(impl, inputs, cu)
        times: dict[str, list[Meter]] = {name: [] for name in IMPLEMENTATIONS}
        for _ in range(args.repeats):
            for name, impl in IMPLEMENTATIONS.items():
                with Meter(args.device) as meter:
                    forward_backward(impl, inputs, cu)
                times[name].append(meter)
                print(f"  T={length} {name}: fwd+bwd {meter.wall:.3f}s", file=sys.stderr, flush=True)
        ops = {
            name: count_ops(impl, inputs, cu) for name, impl in IMPLEMENTATIONS.items() if name != "parallel-compiled"
        }
        base_wall = statistics.median(m.wall for m in times[BASELINE])
        base_cpu = statistics.median(m.cpu for m in times[BASELINE])
        for name, meters in times.items():
            wall, cpu = statistics.median(m.wall for m in meters), statistics.median(m.cpu for m in meters)
            rows.append((length, segments, name, wall, cpu, base_wall / wall, base_cpu / cpu, ops.get(name)))

    print(f"\nAccuracy at T={args.accuracy_length} in 3 segments with initial states vs the fp64 reference")
    print("(worst over output, final state and the gradients of q, k, v, g, beta, initial state of")
    print("max abs error / max abs reference value):\n")
    print("| implementation | fp64 inputs | fp32 inputs |\n|---|---|---|")
    for name, by_dtype in errors.items():
        print(f"| {name} | {by_dtype['float64']:.1e} | {by_dtype['float32']:.1e} |")

    print(f"\nForward+backward, median of {args.repeats}; speed = {BASELINE} time / this time.\n")
    print(
        "| T | segments | path | fwd+bwd wall s | fwd+bwd CPU s | speed vs chunk (wall) | speed vs chunk (CPU) "
        "| ops fwd | ops fwd+bwd |"
    )
    print("|---" * 9 + "|")
    for length, segments, name, wall, cpu, wall_ratio, cpu_ratio, ops in rows:
        counted = f"{ops[0]} | {ops[1]}" if ops else "n/a | n/a"
        print(
            f"| {length} | {segments} | {name} | {wall:.3f} | {cpu:.2f} | {wall_ratio:.2f}x | {cpu_ratio:.2f}x | {counted} |"
        )

    print(f"\nOps dispatched at T={args.scaling_length} by segment count (eager paths):\n")
    print("| segments | chunk fwd | chunk fwd+bwd | parallel fwd | parallel fwd+bwd |\n|---|---|---|---|---|")
    inputs = make_inputs(args.scaling_length, torch.float32, args.device)
    for segments in args.scaling_segments:
        cu = packed_borders(args.scaling_length, segments).to(args.device)
        counts = [count_ops(IMPLEMENTATIONS[name], inputs, cu) for name in (BASELINE, "parallel")]
        print(f"| {segments} | {counts[0][0]} | {counts[0][1]} | {counts[1][0]} | {counts[1][1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

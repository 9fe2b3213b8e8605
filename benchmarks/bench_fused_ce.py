"""Peak memory and time of the causal-LM loss: chunked fused CE (``enable_liger_kernel`` on CPU) vs full logits.

Baseline: transformers' path — ``lm_head`` over the whole sequence, then ``ForCausalLMLoss`` (which
upcasts the logits to fp32). Each point runs in a fresh subprocess; peak = ``ru_maxrss`` during
loss + backward minus the resident set before it.

    python benchmarks/bench_fused_ce.py --lengths 4096 16384 --vocab 151936 --hidden 512
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from subprocess_points import run_point


def measure(kind: str, length: int, vocab: int, hidden: int) -> dict:
    import torch

    from llamafactory_zebra.loss import fused_causal_lm_loss

    torch.manual_seed(0)
    states = torch.randn(1, length, hidden, requires_grad=True)
    head = torch.nn.Linear(hidden, vocab, bias=False)
    labels = torch.randint(0, vocab, (1, length))
    baseline_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if kind == "fused":
        loss = fused_causal_lm_loss(states, head.weight, labels, force="chunked")
    else:
        from transformers.loss.loss_utils import ForCausalLMLoss

        loss = ForCausalLMLoss(head(states), labels, vocab_size=vocab)
    loss.backward()
    elapsed = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"loss": loss.item(), "seconds": elapsed, "peak_mib": (peak_kib - baseline_kib) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--point", nargs=2, metavar=("KIND", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.point:
        print(json.dumps(measure(args.point[0], int(args.point[1]), args.vocab, args.hidden)))
        return

    print(
        f"loss + backward, vocab {args.vocab}, hidden {args.hidden}, fp32, CPU; baseline: full logits + ForCausalLMLoss"
    )
    print("| T | fused peak MiB | full-logits peak MiB | memory ratio | fused s | full s | time ratio | |loss diff| |")
    print("|---|---|---|---|---|---|---|---|")
    for length in args.lengths:
        arguments = [str(length), "--vocab", str(args.vocab), "--hidden", str(args.hidden)]
        results = {kind: run_point(__file__, ["--point", kind, *arguments]) for kind in ("fused", "full")}
        f, b = results["fused"], results["full"]
        if b is None:
            print(f"| {length} | {f['peak_mib']:.0f} | killed (out of memory) | – | {f['seconds']:.2f} | – | – | – |")
            continue
        print(
            f"| {length} | {f['peak_mib']:.0f} | {b['peak_mib']:.0f} | {f['peak_mib'] / b['peak_mib']:.3f} "
            f"| {f['seconds']:.2f} | {b['seconds']:.2f} | {f['seconds'] / b['seconds']:.2f} "
            f"| {abs(f['loss'] - b['loss']):.1e} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

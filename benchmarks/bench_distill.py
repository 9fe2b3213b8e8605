"""Distillation memory and time on CPU: the chunked KD loss vs full logits, and an ILD step vs a whole-model step.

KD table — loss + backward from the two models' final hidden states ``[T, H]`` through two
``vocab``-way lm_heads (Qwen3's 151,936 by default), fp32. Baseline in the same run: full logits of both
models, then ``log_softmax`` and the KL (``distill.kd_loss.full_logits_kd_loss_sums``, autograd backward).

ILD table — one training step (forward + backward) of a Zebra student of ``--hidden``/``--layers`` on
``T`` tokens, teacher states precomputed: ILD with the student's non-reentrant gradient checkpointing
(what the trainer uses: one layer's activations at a time in backward), ILD without checkpointing, and
the baseline: a whole-model SFT step (fused CE) without checkpointing.

Each point runs in a fresh subprocess; peak = ``ru_maxrss`` rise during the measured work.

    python benchmarks/bench_distill.py --lengths 4096 16384 --vocab 151936 --hidden 512
    python benchmarks/bench_distill.py --ild --ild-length 2048 --hidden 512 --layers 8
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from subprocess_points import run_point


def measure_kd(kind: str, length: int, vocab: int, hidden: int) -> dict:
    import torch

    from llamafactory_zebra.distill.kd_loss import full_logits_kd_loss_sums, kd_loss_sums

    torch.manual_seed(0)
    student = torch.randn(length, hidden, requires_grad=True)
    teacher = torch.randn(length, hidden)
    head_s = torch.nn.Linear(hidden, vocab, bias=False)
    head_t = torch.nn.Linear(hidden, vocab, bias=False)
    targets = torch.randint(0, vocab, (length,))
    loss_fn = kd_loss_sums if kind == "chunked" else full_logits_kd_loss_sums
    baseline_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    total, _, _ = loss_fn(student, head_s.weight, teacher, head_t.weight, targets)
    total.backward()
    elapsed = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"loss": total.item() / length, "seconds": elapsed, "peak_mib": (peak_kib - baseline_kib) / 1024}


def measure_ild(kind: str, length: int, hidden: int, layers: int) -> dict:
    import torch

    from llamafactory_zebra import ZebraConfig, ZebraForCausalLM
    from llamafactory_zebra.distill.ild import ild_layer_losses, teacher_forced, teacher_layer_states

    config = ZebraConfig.from_preset(
        "tiny",
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        layer_types=["mla" if i % 4 == 1 else "gdn" for i in range(layers)],
        vocab_size=1024,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    teacher, student = ZebraForCausalLM(config).eval(), ZebraForCausalLM(config).train()
    ids = torch.randint(0, 1024, (1, length))
    labels = ids.clone()
    real = torch.ones_like(ids, dtype=torch.bool)
    states = teacher_layer_states(teacher, input_ids=ids)
    if kind == "ild_checkpointed":
        student.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if kind == "sft":
        student.enable_fused_cross_entropy("chunked")
    baseline_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if kind == "sft":
        loss = student(input_ids=ids, labels=labels).loss
        loss.backward()
    else:
        with teacher_forced(student, states) as recorded:

            def head_loss(hidden_states, weight):
                losses = ild_layer_losses(recorded, states, range(layers), real)
                return torch.stack(list(losses.values())).sum()

            loss = student(input_ids=ids, head_loss_fn=head_loss).loss
            loss.backward()
    elapsed = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"loss": loss.item(), "seconds": elapsed, "peak_mib": (peak_kib - baseline_kib) / 1024}


def kd_table(args: argparse.Namespace) -> None:
    print(
        f"KD loss + backward, vocab {args.vocab}, hidden {args.hidden}, fp32, CPU; baseline: full logits of both models"
    )
    print(
        "| T | chunked peak MiB | full-logits peak MiB | memory ratio | chunked s | full s | time ratio | |loss diff| |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for length in args.lengths:
        arguments = [str(length), "--vocab", str(args.vocab), "--hidden", str(args.hidden)]
        results = {kind: run_point(__file__, ["--kd-point", kind, *arguments]) for kind in ("chunked", "full")}
        c, f = results["chunked"], results["full"]
        if f is None:
            print(f"| {length} | {c['peak_mib']:.0f} | killed (out of memory) | – | {c['seconds']:.2f} | – | – | – |")
            continue
        print(
            f"| {length} | {c['peak_mib']:.0f} | {f['peak_mib']:.0f} | {c['peak_mib'] / f['peak_mib']:.3f} "
            f"| {c['seconds']:.2f} | {f['seconds']:.2f} | {c['seconds'] / f['seconds']:.2f} "
            f"| {abs(c['loss'] - f['loss']):.1e} |",
            flush=True,
        )


def ild_table(args: argparse.Namespace) -> None:
    print(
        f"one step, Zebra hidden {args.hidden}, {args.layers} layers, T={args.ild_length}, fp32, CPU; "
        "baseline: whole-model SFT step (fused CE), no checkpointing"
    )
    print("| step | peak MiB | vs SFT | s | vs SFT |")
    print("|---|---|---|---|---|")
    kinds = ("sft", "ild_full_graph", "ild_checkpointed")
    arguments = ["--hidden", str(args.hidden), "--layers", str(args.layers)]
    results = {kind: run_point(__file__, ["--ild-point", kind, str(args.ild_length), *arguments]) for kind in kinds}
    base = results["sft"]
    for kind in kinds:
        r = results[kind]
        print(
            f"| {kind} | {r['peak_mib']:.0f} | {r['peak_mib'] / base['peak_mib']:.2f} | {r['seconds']:.2f} "
            f"| {r['seconds'] / base['seconds']:.2f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--ild", action="store_true", help="run the ILD table instead of the KD table")
    parser.add_argument("--ild-length", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--kd-point", nargs=2, metavar=("KIND", "LENGTH"), help=argparse.SUPPRESS)
    parser.add_argument("--ild-point", nargs=2, metavar=("KIND", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kd_point:
        print(json.dumps(measure_kd(args.kd_point[0], int(args.kd_point[1]), args.vocab, args.hidden)))
    elif args.ild_point:
        print(json.dumps(measure_ild(args.ild_point[0], int(args.ild_point[1]), args.hidden, args.layers)))
    elif args.ild:
        ild_table(args)
    else:
        kd_table(args)


if __name__ == "__main__":
    main()

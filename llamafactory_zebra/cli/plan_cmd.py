"""``llamafactory-zebra plan TRAIN.yaml``: per-GPU memory of a LLaMA-Factory training run, and a verdict.

Exit codes: 0 the run fits, 1 it does not fit (the output names the cheapest change that would),
2 the YAML or the options are invalid.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from huggingface_hub.errors import StrictDataclassError

from ..planning.activations import activation_estimate
from ..planning.hardware import GIB, GPUS, gpu_memory_bytes
from ..planning.memory_plan import MemoryPlan, TrainingSetup, cheapest_fix, make_plan
from .commands import SUBCOMMANDS

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_INVALID = 0, 1, 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help=SUBCOMMANDS["plan"].help,
        description="Per-GPU memory of a LLaMA-Factory training YAML for a Zebra model, with a verdict. "
        "Exit code 0: fits; 1: does not fit; 2: invalid input.",
    )
    parser.add_argument("train_yaml", help="the YAML you pass to `llamafactory-cli train`")
    parser.add_argument("--gpus", type=int, default=8, help="number of GPUs (all nodes); default 8")
    parser.add_argument("--gpu-type", choices=sorted(GPUS), default="mi300x", help="known GPU; default mi300x")
    parser.add_argument("--gpu-memory", type=float, help="GiB per GPU (overrides --gpu-type)")
    parser.add_argument("--sp", type=int, help="sequence-parallel size (overrides sequence_parallel_size)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..planning.yaml_setup import setup_from_yaml

    try:
        memory, label = gpu_memory_bytes(args.gpu_type, args.gpu_memory)
        setup = setup_from_yaml(args.train_yaml, args.gpus, memory, label, args.sp)
        plan = make_plan(setup)
    except (ValueError, StrictDataclassError) as error:
        print(f"llamafactory-zebra plan: {error}", file=sys.stderr)
        return EXIT_INVALID
    fix = None if plan.fits else cheapest_fix(setup)
    report = plan_report(plan, fix)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return EXIT_FITS if plan.fits else EXIT_DOES_NOT_FIT


def _lengths(cutoff: int) -> list[int]:
    lengths, n = [], 4096
    while n < cutoff:
        lengths.append(n)
        n *= 4
    return lengths + [cutoff]


def length_table(setup: TrainingSetup) -> list[dict[str, Any]]:
    """Activation peaks per GPU at several sequence lengths, with and without gradient checkpointing."""
    rows = []
    for length in _lengths(setup.cutoff_len):
        tokens = setup.micro_batch * -(-length // setup.sequence_parallel)
        on, off = (
            activation_estimate(setup.config, tokens, setup.act_bytes, setup.kernels, gc, setup.checkpoints_on_cpu)
            for gc in (True, False)
        )
        rows.append(
            {
                "sequence_length": length,
                "tokens_per_gpu": tokens,
                "checkpointing_on": on.peak,
                "checkpointing_off": off.peak,
                "mla_saved_per_layer": on.mla_layer.total_saved * tokens,
                "gdn_saved_per_layer": on.gdn_layer.total_saved * tokens,
            }
        )
    return rows


def plan_report(plan: MemoryPlan, fix: tuple[list[str], MemoryPlan] | None) -> dict[str, Any]:
    s, st, act = plan.setup, plan.states, plan.activations
    return {
        "model": {
            "source": s.model_label,
            "parameters": plan.parameters.total,
            "trainable": plan.trainable,
            "finetuning_type": s.finetuning_type,
            "mla_layers": s.config.layer_types.count("mla"),
            "gdn_layers": s.config.layer_types.count("gdn"),
        },
        "run": {
            "gpus": s.gpus,
            "gpu": s.gpu_label,
            "gpu_memory": s.gpu_memory,
            "usable_memory": plan.usable,
            "deepspeed": s.deepspeed_label,
            "zero_stage": s.zero_stage,
            "offload_optimizer": s.offload_optimizer,
            "offload_params": s.offload_params,
            "precision": s.precision,
            "cutoff_len": s.cutoff_len,
            "per_device_train_batch_size": s.micro_batch,
            "sequence_parallel_size": s.sequence_parallel,
            "tokens_per_gpu": s.tokens_per_gpu,
            "gradient_checkpointing": s.gradient_checkpointing,
            "checkpoints_on_cpu": s.checkpoints_on_cpu,
            "fused_cross_entropy": s.fused_cross_entropy,
            "attention": s.attention,
            "packing": s.packing,
        },
        "model_states": {
            "parameters": st.parameters,
            "gradients": st.gradients,
            "optimizer": st.optimizer,
            "zero3_gathered_module": st.gathered,
            "autocast_copies": st.autocast_copies,
            "communication_buffers": st.buffers,
            "optimizer_step_extra": st.step_extra,
            "host_memory_per_rank": st.cpu_per_rank,
        },
        "activations": {
            "kernels": dataclasses.asdict(s.kernels),
            "per_token_mla_layer_saved": act.mla_layer.total_saved,
            "per_token_gdn_layer_saved": act.gdn_layer.total_saved,
            "per_token_mla_layer_parts": act.mla_layer.saved,
            "per_token_gdn_layer_parts": act.gdn_layer.saved,
            "layers_saved": act.layers_saved,
            "mla_layers_saved_without_checkpointing": act.components["mla layers"],
            "gdn_layers_saved_without_checkpointing": act.components["gdn layers"],
            "model_saved": act.model_saved,
            "loss_peak": act.loss_peak,
            "largest_layer_backward": act.layer_peak,
            "packing_mask": plan.packing_mask,
            "peak": act.peak,
            "by_length": length_table(s),
        },
        "logits": {"unfused_peak": plan.unfused_logits_peak, "fused_peak": plan.fused_logits_peak},
        "inference_cache_one_sequence_at_cutoff": plan.inference_cache,
        "verdict": {
            "backward_phase_peak": plan.backward_phase,
            "optimizer_step_peak": st.during_step,
            "peak": plan.peak,
            "usable": plan.usable,
            "fits": plan.fits,
            "cheapest_change": None if fix is None else fix[0],
            "peak_after_change": None if fix is None else fix[1].peak,
            "no_listed_change_fits": not plan.fits and fix is None,
        },
    }


def _gib(n: float) -> str:
    return f"{n / GIB:9.2f}"


def render(r: dict[str, Any]) -> str:
    m, run_, st, act, v = r["model"], r["run"], r["model_states"], r["activations"], r["verdict"]
    stage = "no DeepSpeed" if run_["zero_stage"] is None else f"ZeRO-{run_['zero_stage']} ({run_['deepspeed']})"
    offload = [name for name in ("optimizer", "params") if run_[f"offload_{name}"]]
    lines = [
        f"model      {m['source']}: {m['parameters']:,} parameters ({m['mla_layers']} MLA + {m['gdn_layers']} GDN "
        f"layers), {m['trainable']:,} trainable ({m['finetuning_type']})",
        f"run        {run_['gpus']} × {run_['gpu']}; {stage}"
        + (f", offload {'+'.join(offload)}" if offload else "")
        + f"; {run_['precision']}; attention {run_['attention']}",
        f"tokens     {run_['per_device_train_batch_size']} × {run_['cutoff_len']:,} "
        f"/ SP {run_['sequence_parallel_size']}"
        f" = {run_['tokens_per_gpu']:,} per GPU per micro-step" + ("; packing" if run_["packing"] else ""),
        "",
        "per GPU                                          GiB",
        f"  parameters                               {_gib(st['parameters'])}",
        f"  gradients                                {_gib(st['gradients'])}",
        f"  optimizer states (master + Adam)         {_gib(st['optimizer'])}",
    ]
    for key, label in (
        ("zero3_gathered_module", "ZeRO-3 gathered module"),
        ("autocast_copies", "autocast bf16 weight copies"),
        ("communication_buffers", "gradient buckets (ZeRO / DDP)"),
    ):
        if st[key]:
            lines.append(f"  {label:<41}{_gib(st[key])}")
    gc = "on" if run_["gradient_checkpointing"] else "off"
    lines += [
        f"  activations (checkpointing {gc}, fused CE {'on' if run_['fused_cross_entropy'] else 'off'})",
        f"    decoder layers kept                    {_gib(act['layers_saved'])}",
        f"    final norm + loss kept                 {_gib(act['model_saved'])}",
        f"    loss working set                       {_gib(act['loss_peak'])}",
        f"    largest layer in backward              {_gib(act['largest_layer_backward'])}",
        f"    activation peak                        {_gib(act['peak'])}",
    ]
    if act["packing_mask"]:
        lines.append(f"    packed T×T attention mask              {_gib(act['packing_mask'])}")
    lines += [
        f"  + during optimizer step                  {_gib(st['optimizer_step_extra'])}",
        "",
        f"saved per token and layer: MLA {act['per_token_mla_layer_saved'] / 1024:.1f} KiB, "
        f"GDN {act['per_token_gdn_layer_saved'] / 1024:.1f} KiB; without checkpointing all MLA layers "
        f"{act['mla_layers_saved_without_checkpointing'] / GIB:.2f} GiB, all GDN layers "
        f"{act['gdn_layers_saved_without_checkpointing'] / GIB:.2f} GiB",
        f"logits + loss per GPU: unfused {r['logits']['unfused_peak'] / GIB:.2f} GiB, "
        f"fused {r['logits']['fused_peak'] / GIB:.2f} GiB",
        f"inference, one {run_['cutoff_len']:,}-token sequence: MLA latent cache "
        f"{r['inference_cache_one_sequence_at_cutoff']['mla latent cache'] / GIB:.2f} GiB, GDN state "
        f"{r['inference_cache_one_sequence_at_cutoff']['gdn state'] / GIB:.3f} GiB",
    ]
    if st["host_memory_per_rank"]:
        lines.append(f"host memory per rank for offloaded states: {st['host_memory_per_rank'] / GIB:.2f} GiB")
    lines += ["", "activation peak by sequence length (GiB per GPU)", "  length      tokens/GPU   ckpt on  ckpt off"]
    for row in act["by_length"]:
        lines.append(
            f"  {row['sequence_length']:<10,}  {row['tokens_per_gpu']:<11,} {row['checkpointing_on'] / GIB:8.2f}"
            f"  {row['checkpointing_off'] / GIB:8.2f}"
        )
    verdict = "FITS" if v["fits"] else "DOES NOT FIT"
    lines += [
        "",
        f"peak {v['peak'] / GIB:.2f} GiB of {v['usable'] / GIB:.2f} GiB usable "
        f"({run_['gpu_memory'] / GIB:.0f} GiB minus runtime reserve): {verdict}",
    ]
    if v["cheapest_change"]:
        lines.append(
            "cheapest change: "
            + "; then ".join(v["cheapest_change"])
            + f" → peak {v['peak_after_change'] / GIB:.2f} GiB"
        )
    elif v["no_listed_change_fits"]:
        lines.append("no change the planner knows fits on these GPUs: add GPUs or shorten cutoff_len")
    return "\n".join(lines)

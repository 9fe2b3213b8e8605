"""Where one training step's memory goes: the tiny-16k Zebra against its dense Qwen3 twin, on one packed row.

Each model runs in a fresh child process (so the peaks do not mix): a plain loop of ``--steps`` steps of
forward, backward and AdamW on one ``--length``-token row packed from samples of ``--samples`` tokens (fp32,
CPU), with what ``llamafactory-cli train`` gives each model under ``neat_packing``: the Zebra the 2-D mask of
segment ids (its plugin turns ``block_diag_attn`` off) and ``position_ids`` restarting per sample, the dense
twin LLaMA-Factory's 4-D additive block-causal mask (``prepare_4d_attention_mask``); LLaMA-Factory's reentrant
per-layer gradient checkpointing (``--no-gradient-checkpointing`` turns it off). The Zebra computes its loss
as under ``enable_liger_kernel`` (chunked CE on CPU); the dense twin takes logits.

It prints two tables:

- resident memory: the process's peak (``VmHWM``) after loading, and within the last step's forward,
  backward and optimizer phases (the peak is reset between phases through ``/proc/self/clear_refs``),
  each also as the growth over the resident set the phase started from. glibc keeps much of what a step
  freed (``MALLOC_MMAP_THRESHOLD_=65536`` in the environment makes the figures follow live tensors);
- what autograd keeps for backward, by module, in one more forward without checkpointing (saved-tensor
  hooks; a storage counted once, at the first module that saves it; parameters not counted): the activations
  of every layer without checkpointing, and of the layer being recomputed with it.

    python benchmarks/profile_train_memory.py                   # 8K row
    python benchmarks/profile_train_memory.py --length 16384
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

MIB = 1 << 20


def _status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set


def sample_lengths(length: int, bounds: str, seed: int) -> list[int]:
    """Sample lengths drawn from ``bounds`` (``LOW-HIGH`` tokens) filling a ``length``-token row, the last one
    cut to what is left."""
    import random

    low, high = (int(n) for n in bounds.split("-"))
    rng = random.Random(seed)
    lengths, left = [], length
    while left > 0:
        take = min(left, rng.randint(low, high))
        lengths.append(take)
        left -= take
    return lengths


def build_models(work: Path) -> dict[str, Path]:
    """The tiny-16k Zebra (random, seed 0) and its dense twin (``bench_longctx_dense.build_dense``)."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_longctx_dense import build_dense

    from llamafactory_zebra import ZebraConfig, ZebraForCausalLM
    from llamafactory_zebra.presets import preset_values

    zebra_dir, dense_dir = work / "zebra", work / "dense"
    torch.manual_seed(0)
    ZebraForCausalLM(ZebraConfig(**preset_values("tiny-16k"))).save_pretrained(zebra_dir)
    build_dense(zebra_dir, dense_dir, tokenizer=False)
    return {"zebra": zebra_dir, "dense": dense_dir}


class SavedBytes:
    """Bytes autograd saves for backward, by the innermost module running when they were saved."""

    def __init__(self, model) -> None:
        import torch

        self.stack: list[str] = ["(outside modules)"]
        self.by_module: dict[str, int] = defaultdict(int)
        self.seen: set[int] = set()
        self.parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
        for name, module in model.named_modules():
            module.register_forward_pre_hook(lambda m, a, name=name: self.stack.append(self._label(name)))
            module.register_forward_hook(lambda m, a, o: self.stack.pop() and None)
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda x: x)

    @staticmethod
    def _label(name: str) -> str:
        # model.layers.3.gdn.q_conv1d -> layers.*.gdn.q_conv1d (per-layer totals are summed by kind)
        parts = name.split(".")
        return ".".join("*" if part.isdigit() else part for part in parts if part != "model") or "(model)"

    def pack(self, tensor):
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if tensor.device.type != "meta" and pointer not in self.seen and pointer not in self.parameters:
            self.seen.add(pointer)
            self.by_module[self.stack[-1]] += storage.nbytes()
        return tensor


def child(model_dir: str, length: int, bounds: str, steps: int, seed: int, checkpointing: bool) -> dict:
    import torch
    from llamafactory.data.collator import prepare_4d_attention_mask
    from transformers import AutoModelForCausalLM

    import llamafactory_zebra  # noqa: F401  (registers model_type zebra)

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    zebra = model.config.model_type == "zebra"
    if zebra:
        model.enable_fused_cross_entropy()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lengths = sample_lengths(length, bounds, seed)
    input_ids = torch.randint(0, model.config.vocab_size, (1, length))
    segments = torch.cat([torch.full((n,), i + 1) for i, n in enumerate(lengths)])[None]
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    mask = segments if zebra else prepare_4d_attention_mask(segments, torch.float32)
    batch = {"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids, "labels": input_ids}
    if checkpointing:  # as LLaMA-Factory enables it unless disable_gradient_checkpointing (reentrant)
        from llamafactory.model.model_utils.checkpointing import _gradient_checkpointing_enable

        _gradient_checkpointing_enable(model, {"use_reentrant": True})
        model.config.use_cache = False
    loaded = _status("VmRSS")
    phases = {}
    for _ in range(steps):
        _reset_peak()
        start = _status("VmRSS")
        loss = model(**batch).loss
        phases["forward"] = (_status("VmHWM"), start)
        _reset_peak()
        start = _status("VmRSS")
        loss.backward()
        phases["backward"] = (_status("VmHWM"), start)
        _reset_peak()
        start = _status("VmRSS")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        phases["optimizer"] = (_status("VmHWM"), start)
    # What one forward without checkpointing keeps for backward (after the measured steps: it moves no peak).
    if checkpointing:
        model.gradient_checkpointing_disable()
    saved = SavedBytes(model)
    with saved.hooks:
        model(**batch).loss.detach()
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "samples": lengths,
        "loaded_mib": loaded,
        "phases": phases,
        "peak_mib": max(peak for peak, _ in phases.values()),
        "saved_mib": {name: size / MIB for name, size in saved.by_module.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=8192, help="packed row length (tokens)")
    parser.add_argument(
        "--samples",
        default="7000-8000",
        help="sample lengths LOW-HIGH, packed until the row is full (the longest "
        "samples of the quickstart's stage 2, whose data takes 2048-8192: the attention peak is the longest sample's)",
    )
    parser.add_argument("--steps", type=int, default=2, help="steps per model; the last one is measured")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-gradient-checkpointing",
        dest="checkpointing",
        action="store_false",
        help="keep every layer's activations (LLaMA-Factory checkpoints each decoder layer, reentrant, by default)",
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/zebra_profile_train_memory"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.length, args.samples, args.steps, args.seed, args.checkpointing)))
        return 0

    models = build_models(args.work)
    results = {}
    for name, path in models.items():
        command = [sys.executable, __file__, "--child", str(path), "--length", str(args.length)]
        command += ["--samples", args.samples, "--steps", str(args.steps), "--seed", str(args.seed)]
        command += [] if args.checkpointing else ["--no-gradient-checkpointing"]
        output = subprocess.run(command, check=True, capture_output=True, text=True, env=os.environ).stdout
        results[name] = json.loads(output.strip().splitlines()[-1])

    names = list(results)
    print(f"row {args.length} tokens, samples {results['zebra']['samples']}; threads "
          f"{os.environ.get('OMP_NUM_THREADS', 'torch default')}; ZEBRA_CPU_KERNELS="
          f"{os.environ.get('ZEBRA_CPU_KERNELS', '(unset)')}; gradient checkpointing "
          f"{'on (reentrant)' if args.checkpointing else 'off'}")  # fmt: skip
    print("parameters: " + ", ".join(f"{n} {results[n]['parameters']:,}" for n in names))
    print(f"\nresident memory, MiB (peak, and growth over the phase's start), step {args.steps} of {args.steps}:")
    print(f"{'':<22}" + "".join(f"{n:>22}" for n in names))
    print(f"{'after loading':<22}" + "".join(f"{results[n]['loaded_mib']:>22.0f}" for n in names))
    for phase in ("forward", "backward", "optimizer"):
        cells = []
        for n in names:
            peak, start = results[n]["phases"][phase]
            cells.append(f"{peak:>12.0f} (+{peak - start:>6.0f})")
        print(f"{phase + ' peak':<22}" + "".join(f"{c:>22}" for c in cells))
    print(f"{'step peak':<22}" + "".join(f"{results[n]['peak_mib']:>22.0f}" for n in names))

    print("\nsaved for backward by one forward without checkpointing, MiB, by module (layers summed by kind):")
    rows = sorted({m for n in names for m in results[n]["saved_mib"]})
    print(f"{'module':<40}" + "".join(f"{n:>10}" for n in names))
    for row in rows:
        print(f"{row:<40}" + "".join(f"{results[n]['saved_mib'].get(row, 0.0):>10.1f}" for n in names))
    print(f"{'total':<40}" + "".join(f"{sum(results[n]['saved_mib'].values()):>10.1f}" for n in names))
    if args.json:
        args.json.write_text(json.dumps({"length": args.length, **results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

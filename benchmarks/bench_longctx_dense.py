"""The long-context quickstart's recipe on a dense Qwen3 of the same size, side by side with the Zebra.

Run ``bash scripts/longctx_quickstart.sh`` first (its data and the Zebra's eval-long reports are reused:
the same rows, YAMLs and steps). This script then

1. builds a ``Qwen3ForCausalLM`` with the quickstart's tokenizer, the Zebra's width, depth and heads, and the
   ``intermediate_size`` that brings its parameter count closest to the Zebra's (MLA and GDN mixers are
   larger than Qwen3's attention at this width, so the dense MLP is wider);
2. runs eval-long on it before training, the two staged ``llamafactory-cli train`` calls with the
   quickstart's YAMLs (model, template ``qwen3`` and output directory overridden), and eval-long after,
   with the quickstart's eval settings; then the learning curve of its checkpoints with the quickstart's curve
   settings, drawn beside the Zebra's (``saves/longctx/dense/curve/curve.png``);
3. measures training tokens/s and the peak resident memory of ``llamafactory-cli train`` for both models on
   8K and 16K packed rows (stage 2's YAML, ``max_steps`` steps, the first one not timed; the peak is the
   train process's ``ru_maxrss``, the whole process: Python, LLaMA-Factory, model, optimizer, activations);
4. prints one eval table (Zebra and dense, before and after) and the throughput table.

    python benchmarks/bench_longctx_dense.py            # after scripts/longctx_quickstart.sh
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

OUT = Path("saves/longctx")
# The venv's own entry points, whether or not the venv is activated.
BIN = Path(sys.executable).parent
LLAMAFACTORY_CLI, ZEBRA_CLI = str(BIN / "llamafactory-cli"), str(BIN / "llamafactory-zebra")
STAGES = ("examples/longctx/stage1_short_cpu.yaml", "examples/longctx/stage2_long_cpu.yaml")
EVAL_ARGS = ["--depths", "3", "--max-new-tokens", "16"]  # as scripts/longctx_quickstart.sh runs eval-long


def build_dense(zebra_dir: Path, output_dir: Path, tokenizer: bool = True) -> tuple[int, int]:
    """A random Qwen3 matching the Zebra's tokenizer, width, depth, heads, RoPE and (closest) parameter count;
    ``tokenizer=False`` for a Zebra directory without one (the tokenizer is then not copied)."""
    import torch
    from dense_twin import qwen3_config
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from llamafactory_zebra import ZebraForCausalLM

    zebra = ZebraForCausalLM.from_pretrained(zebra_dir)
    target = sum(p.numel() for p in zebra.parameters())
    z = zebra.config

    def config(intermediate: int):
        return qwen3_config(z, intermediate, head_dim=z.hidden_size // z.num_attention_heads)

    with torch.device("meta"):
        counts = {
            size: sum(p.numel() for p in Qwen3ForCausalLM(config(size)).parameters()) for size in range(64, 2049, 8)
        }
    intermediate = min(counts, key=lambda size: abs(counts[size] - target))
    torch.manual_seed(0)
    dense = Qwen3ForCausalLM(config(intermediate))
    dense.generation_config.eos_token_id = z.eos_token_id
    dense.generation_config.pad_token_id = z.pad_token_id
    dense.save_pretrained(output_dir)
    if tokenizer:
        AutoTokenizer.from_pretrained(zebra_dir).save_pretrained(output_dir)
    return target, counts[intermediate]


def run(command: list[str], check: bool = True) -> dict:
    """Run ``command``: its wall time, exit code and its own peak resident set (``wait4``'s rusage of that child)."""
    print("$", " ".join(command), flush=True)
    started = time.perf_counter()
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if check and code != 0:
        raise SystemExit(f"failed ({code}): {' '.join(command)}")
    return {"seconds": time.perf_counter() - started, "exit_code": code, "peak_rss_mib": usage.ru_maxrss / 1024}


def infer_yaml(model: Path, template: str, path: Path) -> Path:
    path.write_text(f"model_name_or_path: {model}\ntemplate: {template}\nenable_thinking: false\n", encoding="utf-8")
    return path


def eval_long(infer: Path, output: Path, settings: dict) -> None:
    lengths = ",".join(str(n) for n in settings["lengths"])
    run([ZEBRA_CLI, "eval-long", "run", str(infer), "--tasks", ",".join(settings["tasks"]), "--lengths",
         lengths, "--samples", str(settings["samples"]), "--output-dir", str(output), *EVAL_ARGS])  # fmt: skip


def learning_curve(dense_dir: Path, stages: list[Path]) -> None:
    """The dense twin's curve with the quickstart's settings, the Zebra's curve drawn beside it (one picture)."""
    zebra = json.loads((OUT / "curve" / "curve.json").read_text(encoding="utf-8"))
    settings = zebra["settings"]
    run([ZEBRA_CLI, "eval-long", "curve", str(dense_dir / "infer_init.yaml"), "--stages", *map(str, stages),
         "--tasks", ",".join(settings["tasks"]), "--lengths", ",".join(map(str, settings["lengths"])),
         "--samples", str(settings["samples"]), "--depths", str(settings["depths"]), "--label", "dense qwen3",
         "--overlay", f"zebra={OUT / 'curve' / 'curve.json'}", "--output-dir", str(dense_dir / "curve")])  # fmt: skip


def dense_overrides(model: Path, output: Path) -> list[str]:
    # Liger's kernels are Triton (GPU only); the Zebra's enable_liger_kernel maps to chunked PyTorch CE on CPU.
    return [f"model_name_or_path={model}", f"output_dir={output}", "template=qwen3", "enable_liger_kernel=false"]


def throughput(model: Path, dense: bool, length: int, steps: int, scratch: Path) -> dict:
    """Tokens/s over steps 2..N of stage 2's YAML at ``cutoff_len=length``, and the process's peak memory."""
    output = scratch / f"{'dense' if dense else 'zebra'}-{length}"
    overrides = dense_overrides(model, output) if dense else [f"model_name_or_path={model}", f"output_dir={output}"]
    measured = run([LLAMAFACTORY_CLI, "train", STAGES[1], *overrides, f"cutoff_len={length}", f"max_steps={steps}",
                    "logging_steps=1", "plot_loss=false"], check=False)  # fmt: skip
    if measured["exit_code"] != 0:  # e.g. killed for memory (-9): a result, not a reason to stop the table
        return {"tokens_per_s": None, **measured}
    logs = [json.loads(line) for line in (output / "trainer_log.jsonl").read_text().splitlines()]
    elapsed = [_seconds(entry["elapsed_time"]) for entry in logs if "loss" in entry]
    timed = elapsed[-1] - elapsed[0]
    return {"tokens_per_s": (len(elapsed) - 1) * length / timed if timed > 0 else None, **measured}


def _seconds(clock: str) -> float:
    hours, minutes, seconds = (float(part) for part in clock.split(":"))
    return 3600 * hours + 60 * minutes + seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384], help="packed row lengths to time")
    parser.add_argument("--steps", type=int, default=4, help="training steps per throughput point (first not timed)")
    parser.add_argument("--skip-recipe", action="store_true", help="throughput only (no dense training/eval)")
    args = parser.parse_args()

    from llamafactory_zebra.evaluation.compare import comparison_table, read_report

    dense_dir = OUT / "dense"
    dense_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    zebra_params, dense_params = build_dense(OUT / "zebra-init", dense_dir / "init")
    print(f"parameters: zebra {zebra_params:,}  dense qwen3 {dense_params:,}", flush=True)
    reports = {}
    if not args.skip_recipe:
        reports = {"zebra before": read_report(OUT / "eval_before")}
        settings = reports["zebra before"]["settings"]
        eval_long(infer_yaml(dense_dir / "init", "qwen3", dense_dir / "infer_init.yaml"), dense_dir / "eval_before",
                  settings)  # fmt: skip
        model, outputs = dense_dir / "init", []
        for index, stage in enumerate(STAGES, start=1):
            outputs.append(dense_dir / f"stage{index}")
            run([LLAMAFACTORY_CLI, "train", stage, *dense_overrides(model, outputs[-1])])
            model = outputs[-1]
        eval_long(infer_yaml(model, "qwen3", dense_dir / "infer_trained.yaml"), dense_dir / "eval_after", settings)
        learning_curve(dense_dir, outputs)
        reports |= {
            "zebra after": read_report(OUT / "eval_after"),
            "dense before": read_report(dense_dir / "eval_before"),
            "dense after": read_report(dense_dir / "eval_after"),
        }
    recipe_seconds = time.perf_counter() - started

    points = []
    for length in args.lengths:
        for name, model, dense in (("zebra", OUT / "zebra-init", False), ("dense qwen3", dense_dir / "init", True)):
            points.append(
                {"model": name, "length": length, **throughput(model, dense, length, args.steps, dense_dir / "speed")}
            )

    if reports:
        print(
            f"\neval-long, percent (seed 42, {settings['samples']} samples per cell, haystack {settings['haystack']}):"
        )
        print(comparison_table(reports))
    print(f"\ntraining throughput (llamafactory-cli train, stage 2's YAML, {args.steps} steps, first not timed):")
    print(f"{'model':<12} {'row':>6} {'tokens/s':>9} {'peak RSS MiB':>13}  exit")
    for point in points:
        rate = "-" if point["tokens_per_s"] is None else f"{point['tokens_per_s']:.0f}"
        print(
            f"{point['model']:<12} {point['length']:>6} {rate:>9} {point['peak_rss_mib']:>13.0f}  {point['exit_code']}"
        )
    recipe = "skipped" if args.skip_recipe else f"{recipe_seconds:.0f} s"
    print(f"\nparameters: zebra {zebra_params:,}, dense qwen3 {dense_params:,}; dense recipe {recipe}; "
          f"threads {os.environ.get('OMP_NUM_THREADS', 'torch default')}")  # fmt: skip
    (dense_dir / "bench.json").write_text(
        json.dumps({"points": points, "params": [zebra_params, dense_params]}, indent=2)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

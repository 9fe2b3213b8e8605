"""``llamafactory-zebra eval-long run INFER.yaml`` (also ``eval-long INFER.yaml``): does the model use its long
context? RULER-style scores.

Writes ``report.json`` (scores per task × length, the depth × length grid, every sample's answer),
``depth_heatmap.png`` (and ``depth_heatmap_TASK.png`` for each of several depth tasks), and with ``--ppl-file`` a
per-position perplexity curve, into ``--output-dir``.
Everything that can be checked without the model — task names, lengths, the haystack source — is
checked before the weights load, and lengths are checked against the model's
``max_position_embeddings`` before any sample is generated.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

LENGTH = re.compile(r"^(\d+(?:\.\d+)?)\s*([kKmM]?)$")


def parse_lengths(text: str) -> list[int]:
    """``4k,16k,1m`` → token counts (k = 1024, m = 1024²), as RULER's tables name them."""
    lengths = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = LENGTH.match(part)
        if not match:
            raise ValueError(f"--lengths: {part!r} is not a length; use numbers like 4096, 4k, 64k or 1m")
        scale = {"": 1, "k": 1024, "m": 1024 * 1024}[match.group(2).lower()]
        lengths.append(int(float(match.group(1)) * scale))
    if not lengths:
        raise ValueError("--lengths: give at least one length")
    return lengths


def check_lengths(lengths: list[int], max_positions: int | None, allow_beyond: bool) -> list[str]:
    """An error (or, with ``allow_beyond``, warnings) for lengths past ``max_position_embeddings``."""
    beyond = [n for n in lengths if max_positions is not None and n > max_positions]
    if not beyond:
        return []
    message = f"--lengths {', '.join(map(str, beyond))} exceed the model's max_position_embeddings ({max_positions})"
    if not allow_beyond:
        raise ValueError(f"{message}; lower them or pass --allow-beyond-max-positions to measure extrapolation")
    return [f"warning: {message}: these scores measure extrapolation"]


def run(args: argparse.Namespace) -> int:
    """Check everything that can be checked before the weights load, score, then write the report and plots."""
    try:
        tasks, lengths, config = _checked_inputs(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    from ..evaluation.haystack import HaystackTooShort, load_haystack
    from ..evaluation.loading import load_for_evaluation
    from ..evaluation.runner import EvalSettings, PromptFormat, run_tasks, summarize

    loaded = load_for_evaluation(config)
    prompt_format = PromptFormat(loaded.tokenizer, loaded.template)
    settings = EvalSettings(
        tasks=tasks,
        lengths=lengths,
        samples=args.samples,
        depths=args.depths,
        seed=args.seed,
        prefill_chunk_size=args.prefill_chunk_size,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
    )
    try:
        haystack = load_haystack(args.haystack, prompt_format.encode_text, args.dataset_dir or loaded.dataset_dir)
        started = time.perf_counter()
        results = run_tasks(loaded.model, loaded.tokenizer, prompt_format, haystack, settings)
    except (HaystackTooShort, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    summary = summarize(results, settings)
    report = {
        "model": loaded.name,
        "config": str(args.config),
        "settings": {
            "tasks": tasks,
            "lengths": lengths,
            "samples": args.samples,
            "depths": args.depths,
            "seed": args.seed,
            "haystack": haystack.source,
            "prefill_chunk_size": args.prefill_chunk_size,
            "max_position_embeddings": loaded.max_position_embeddings,
        },
        **summary,
        "seconds": round(time.perf_counter() - started, 1),
        "samples": [r.to_dict() for r in results],
    }
    _write_outputs(args, report, summary, lengths, loaded, prompt_format)
    return 0


def _checked_inputs(args: argparse.Namespace) -> tuple[list[str], list[int], dict]:
    """The tasks, the lengths and the inference YAML, checked (lengths against the model's positions); the
    warnings for lengths allowed beyond them are printed."""
    from ..evaluation.loading import max_positions, read_inference_yaml
    from ..evaluation.tasks import TASKS, check_task_names

    tasks = check_task_names([t.strip() for t in args.tasks.split(",") if t.strip()] or list(TASKS))
    lengths = parse_lengths(args.lengths)
    if args.ppl_file and not Path(args.ppl_file).is_file():
        raise ValueError(f"--ppl-file {args.ppl_file}: no such file")
    config = read_inference_yaml(args.config)
    warnings = check_lengths(
        lengths,
        max_positions(config["model_name_or_path"], config.get("trust_remote_code", False)),
        args.allow_beyond_max_positions,
    )
    for warning in warnings:
        print(warning, file=sys.stderr)
    return tasks, lengths, config


def _write_outputs(args: argparse.Namespace, report: dict, summary: dict, lengths: list[int], loaded, prompt_format):
    """The score table, the depth heatmaps, the perplexity curve (``--ppl-file``) and ``report.json``."""
    from ..evaluation import report as rep
    from ..evaluation.runner import perplexity_curve

    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    print(rep.score_table(summary, lengths))
    if summary["depth_heatmap"]["tasks"]:
        heatmap = rep.plot_depth_heatmap(
            summary["depth_heatmap"],
            output / "depth_heatmap.png",
            f"{loaded.name}: {', '.join(summary['depth_heatmap']['tasks'])}",
        )
        print(f"depth × length heatmap: {heatmap}")
    if len(summary["depth_heatmaps"]) > 1:
        for task, grid in summary["depth_heatmaps"].items():
            rep.plot_depth_heatmap(grid, output / f"depth_heatmap_{task}.png", f"{loaded.name}: {task}")
        print(f"one per task: {output / 'depth_heatmap_TASK.png'} ({', '.join(summary['depth_heatmaps'])})")
    if args.ppl_file:
        import torch

        text = Path(args.ppl_file).read_text(encoding="utf-8")
        ids = torch.tensor(prompt_format.encode_text(text)[: max(lengths)])
        report["perplexity"] = perplexity_curve(loaded.model, ids, args.prefill_chunk_size, bins=args.ppl_bins)
        report["perplexity"]["file"] = str(args.ppl_file)
        curve = rep.plot_perplexity(report["perplexity"], output / "perplexity.png", f"{loaded.name}: {args.ppl_file}")
        print(f"perplexity over {ids.numel()} tokens: {report['perplexity']['overall']:.3f} (curve: {curve})")
    print(f"report: {rep.write_json(report, output / 'report.json')}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..evaluation.tasks import TASKS

    parser.add_argument(
        "config", help="LLaMA-Factory inference YAML (model_name_or_path, adapter_name_or_path, template)"
    )
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, from: {', '.join(TASKS)}")
    parser.add_argument("--lengths", default="4k,8k,16k", help="context lengths in tokens, e.g. 4k,16k,64k,128k")
    parser.add_argument("--samples", type=int, default=20, help="samples per task and length")
    parser.add_argument("--depths", type=int, default=10, help="needle depths (evenly spaced 0-100%%) for the heatmap")
    parser.add_argument("--seed", type=int, default=42, help="fixes every generated sample")
    parser.add_argument(
        "--haystack",
        default=None,
        help="filler text: 'noise' (default, RULER's), a text file, or a dataset name from dataset_info.json",
    )
    parser.add_argument(
        "--dataset-dir", default=None, help="where dataset_info.json is (default: the YAML's dataset_dir)"
    )
    parser.add_argument("--ppl-file", default=None, help="a long document: write its per-position perplexity curve")
    parser.add_argument("--ppl-bins", type=int, default=32, help="windows of the perplexity curve")
    parser.add_argument("--prefill-chunk-size", type=int, default=8192, help="tokens per prefill forward")
    parser.add_argument("--batch-size", type=int, default=1, help="samples decoded together (left-padded)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="answer budget (default: per task, RULER's)")
    parser.add_argument("--output-dir", default="eval_long", help="where report.json and the plots go")
    parser.add_argument(
        "--allow-beyond-max-positions",
        action="store_true",
        help="warn instead of failing for lengths above max_position_embeddings",
    )
    parser.set_defaults(func=run)

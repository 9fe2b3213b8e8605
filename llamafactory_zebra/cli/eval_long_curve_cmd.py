"""``llamafactory-zebra eval-long curve INFER.yaml --stages DIR ...``: eval-long scores against training tokens.

A subcommand of the ``eval-long`` group (``eval_long_cmd.py``; ``eval-long-curve``, its spelling before the group,
stays as an alias). The YAML names the model training started from (the point at 0 tokens) and the
template; each ``--stages`` directory is one ``llamafactory-cli train`` output, in training order, whose
checkpoints are the other points (:mod:`llamafactory_zebra.evaluation.curve`). ``--overlay LABEL=curve.json``
draws another run's curve (a dense twin's) on the same picture.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .commands import SUBCOMMANDS
from .eval_long_compare_cmd import parse_labelled
from .eval_long_run_cmd import parse_lengths


def run(args: argparse.Namespace) -> int:
    from ..evaluation.curve import plot_curves, run_points, score_points
    from ..evaluation.loading import read_inference_yaml
    from ..evaluation.tasks import check_task_names

    try:
        tasks = check_task_names([t.strip() for t in args.tasks.split(",") if t.strip()])
        lengths = parse_lengths(args.lengths)
        config = read_inference_yaml(args.config)
        points = run_points(config["model_name_or_path"], args.stages)
        overlays = {
            label: json.loads(Path(path).read_text(encoding="utf-8"))["points"]
            for label, path in parse_labelled(args.overlay).items()
        }
    except (ValueError, FileNotFoundError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    from ..evaluation.haystack import load_haystack
    from ..evaluation.loading import load_for_evaluation
    from ..evaluation.runner import EvalSettings, PromptFormat, run_tasks, summarize

    settings = EvalSettings(
        tasks=tasks,
        lengths=lengths,
        samples=args.samples,
        depths=args.depths,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
    )

    def score(model: str) -> dict:
        loaded = load_for_evaluation({**config, "model_name_or_path": model})
        prompt_format = PromptFormat(loaded.tokenizer, loaded.template)
        haystack = load_haystack(args.haystack, prompt_format.encode_text, loaded.dataset_dir)
        summary = summarize(
            run_tasks(loaded.model, loaded.tokenizer, prompt_format, haystack, settings, False), settings
        )
        cells = "  ".join(f"{task} {n}: {v:.0f}%" for task, row in summary["scores"].items() for n, v in row.items())
        print(f"{model}: {cells}", flush=True)
        return summary["scores"]

    scored = score_points(points, score)
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    curve = output / "curve.json"
    measured = {"tasks": tasks, "lengths": lengths, "samples": args.samples, "depths": args.depths, "seed": args.seed}
    record = {"label": args.label, "config": str(args.config), "stages": args.stages, "settings": measured}
    curve.write_text(json.dumps({**record, "points": scored}, indent=2) + "\n", encoding="utf-8")
    title = f"{', '.join(tasks)} against training tokens ({args.samples} samples per point and length)"
    picture = plot_curves({args.label: scored, **overlays}, output / "curve.png", title)
    print(f"curve: {curve}  picture: {picture}")
    return 0


DESCRIPTION = (
    "Score the start model and every checkpoint of staged training runs (save_steps, "
    "include_num_input_tokens_seen) with eval-long's samples; write curve.json and curve.png."
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``eval-long-curve``, the alias."""
    add_arguments(
        subparsers.add_parser("eval-long-curve", help=SUBCOMMANDS["eval-long-curve"].help, description=DESCRIPTION)
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="inference YAML: the model training started from, its template")
    parser.add_argument("--stages", nargs="+", required=True, help="llamafactory-cli train output dirs, in order")
    parser.add_argument("--tasks", default="passkey", help="comma-separated eval-long tasks")
    parser.add_argument("--lengths", default="2k,8k", help="context lengths in tokens, e.g. 2k,8k")
    parser.add_argument("--samples", type=int, default=10, help="samples per task, length and point")
    parser.add_argument("--depths", type=int, default=5, help="needle depths the samples cycle through")
    parser.add_argument("--seed", type=int, default=42, help="fixes every generated sample")
    parser.add_argument("--haystack", default=None, help="filler text, as for eval-long")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="answer budget (default: per task)")
    parser.add_argument("--label", default="model", help="this run's name in the picture")
    parser.add_argument("--overlay", nargs="*", default=[], help="LABEL=curve.json of other runs to draw too")
    parser.add_argument("--output-dir", default="eval_long_curve", help="where curve.json and curve.png go")
    parser.set_defaults(func=run)

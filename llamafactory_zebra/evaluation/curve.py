"""A learning curve: eval-long scores of a run's checkpoints against the training tokens that made them.

Why it exists: a before/after table says whether training taught the skill; the curve says when, and whether
more tokens would help, which is what a user deciding on GPU time needs. A run is one or more staged
``llamafactory-cli train`` output directories (each continuing from the one before); their ``checkpoint-N``
directories (``save_steps``, ``save_only_model``) and final weights are the points, placed at the tokens the
Trainer counted (``include_num_input_tokens_seen``, stored in each ``trainer_state.json``), stages added up.
The model the first stage started from is the point at 0 tokens. Every point is scored with eval-long's own
samples (:func:`~llamafactory_zebra.evaluation.runner.run_tasks`), so the curve's last point is the table's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
STATE_FILE = "trainer_state.json"


@dataclass(frozen=True)
class CurvePoint:
    """Weights to score and the training tokens behind them (all stages up to here)."""

    model: str
    tokens: int


def _tokens_seen(state_file: Path) -> int:
    state = json.loads(state_file.read_text(encoding="utf-8"))
    tokens = state.get("num_input_tokens_seen", 0)
    if not tokens:
        raise ValueError(
            f"{state_file}: no num_input_tokens_seen; train with include_num_input_tokens_seen: true to place "
            "checkpoints on a token axis"
        )
    return int(tokens)


def run_points(start_model: str, stage_dirs: Sequence[str | Path]) -> list[CurvePoint]:
    """The start model at 0 tokens, then each stage's checkpoints in step order and its final weights.

    The final weights are a point of their own (their count from the ``trainer_state.json`` LLaMA-Factory writes
    beside them at the end) unless the last checkpoint is the last step; the next stage's tokens add to them.
    """
    points, offset = [CurvePoint(str(start_model), 0)], 0
    for stage in map(Path, stage_dirs):
        if not stage.is_dir():
            raise FileNotFoundError(f"{stage}: no such training output directory")
        checkpoints = sorted(
            (int(match.group(1)), path)
            for path in stage.iterdir()
            if path.is_dir() and (match := CHECKPOINT.match(path.name)) and (path / STATE_FILE).is_file()
        )
        if not checkpoints:
            raise ValueError(
                f"{stage}: no checkpoint-N directory with {STATE_FILE}; train with save_strategy: steps and "
                "save_steps to get the points of a curve"
            )
        stage_tokens = 0
        for _, path in checkpoints:
            stage_tokens = _tokens_seen(path / STATE_FILE)
            points.append(CurvePoint(str(path), offset + stage_tokens))
        final_state = stage / STATE_FILE
        if final_state.is_file() and json.loads(final_state.read_text()).get("global_step") != checkpoints[-1][0]:
            stage_tokens = _tokens_seen(final_state)
            points.append(CurvePoint(str(stage), offset + stage_tokens))
        offset += stage_tokens
    return points


def score_points(
    points: Sequence[CurvePoint], score: Callable[[str], dict[str, dict[str, float | None]]]
) -> list[dict[str, Any]]:
    """``score(model)`` (eval-long's ``scores``: task → length → percent) at every point, in order."""
    return [{"model": point.model, "tokens": point.tokens, "scores": score(point.model)} for point in points]


def plot_curves(curves: dict[str, list[dict[str, Any]]], path: str | Path, title: str) -> Path:
    """Score (percent) against training tokens: one line per run label × task × length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .report import format_length

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    styles = ("-", "--", ":", "-.")
    for style, (label, points) in zip(styles * 4, curves.items(), strict=False):
        for task, by_length in points[0]["scores"].items():
            for length in by_length:
                xs = [point["tokens"] / 1e6 for point in points]
                ys = [point["scores"][task][length] for point in points]
                ax.plot(xs, ys, style, marker="o", markersize=3, label=f"{label} {task} {format_length(int(length))}")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("score (%)")
    ax.set_ylim(-3, 103)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

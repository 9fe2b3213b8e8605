"""What eval-long writes: a JSON report, a needle depth × length heatmap, a perplexity curve, a table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def format_length(tokens: int) -> str:
    if tokens % (1 << 20) == 0:
        return f"{tokens >> 20}M"
    if tokens % 1024 == 0:
        return f"{tokens >> 10}K"
    return str(tokens)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def score_table(summary: dict[str, Any], lengths: list[int]) -> str:
    """Tasks as rows, lengths as columns, scores in percent, the mean over tasks last."""
    header = ["task", *(format_length(n) for n in lengths)]
    rows = [[task, *(_cell(by_length[str(n)]) for n in lengths)] for task, by_length in summary["scores"].items()]
    rows.append(["average", *(_cell(summary["average"][str(n)]) for n in lengths)])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
        for row in [header, *rows]
    ]
    return "\n".join(lines)


def write_json(report: dict[str, Any], path: Path) -> Path:
    path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return path


def plot_depth_heatmap(heatmap: dict[str, Any], path: Path, title: str) -> Path:
    """Needle depth (rows, 0 % = start of the context) × context length (columns), score colour-coded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    grid = np.array([[np.nan if v is None else v for v in row] for row in heatmap["scores"]], dtype=float)
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(heatmap["lengths"]), 1.0 + 0.45 * len(heatmap["depths"])))
    image = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(len(heatmap["lengths"])), [format_length(n) for n in heatmap["lengths"]])
    ax.set_yticks(range(len(heatmap["depths"])), [f"{100 * d:.0f}%" for d in heatmap["depths"]])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    for (row, col), value in np.ndenumerate(grid):
        if not np.isnan(value):
            ax.text(col, row, f"{value:.0f}", ha="center", va="center", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="score (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_perplexity(curve: dict[str, Any], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(curve["position"], curve["perplexity"], marker=".")
    ax.set_xlabel("position in the document (tokens)")
    ax.set_ylabel("perplexity (window mean)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

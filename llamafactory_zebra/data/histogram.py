"""The token-length histogram PNG of ``data inspect`` (one panel per dataset, cutoff marked)."""

from __future__ import annotations

import math
from pathlib import Path


def write_length_histogram(lengths: dict[str, list[int]], cutoff_len: int, path: str | Path) -> Path:
    """Log-spaced bins, so 100-token chats and 1M-token documents share one readable axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(lengths) or ["(no datasets)"]
    figure, axes = plt.subplots(len(names), 1, figsize=(8, 2.2 * len(names) + 0.6), squeeze=False)
    longest = max([cutoff_len] + [max(values) for values in lengths.values() if values])
    edges = np.logspace(0, math.log10(max(longest, 2)) + 0.05, 60)
    for axis, name in zip(axes[:, 0], names, strict=True):
        values = lengths.get(name, [])
        axis.hist(values, bins=edges, color="#4c72b0")
        axis.axvline(cutoff_len, color="#c44e52", linestyle="--", label=f"cutoff_len {cutoff_len:,}")
        axis.set_xscale("log")
        axis.set_ylabel("rows")
        axis.set_title(f"{name}: {len(values):,} rows", fontsize=10)
        axis.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("tokens per row (template applied, before truncation)")
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path

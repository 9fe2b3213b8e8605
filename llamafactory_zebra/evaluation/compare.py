"""Several ``eval-long`` reports side by side: before/after training, Zebra beside a dense model.

``eval-long`` prints one model's table; the long-context quickstart and its dense comparison need the same
cells of several runs in one table (rows: task × length, columns: runs), which is all this module does.
Run it as ``llamafactory-zebra eval-long compare LABEL=DIR ...``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .report import format_length


def read_report(path: str | Path) -> dict[str, Any]:
    """An ``eval-long`` ``report.json`` (a directory means its ``report.json``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no eval-long report (run llamafactory-zebra eval-long first)")
    return json.loads(path.read_text(encoding="utf-8"))


def comparison_table(reports: dict[str, dict[str, Any]]) -> str:
    """Rows task × length (the first report's order), one score column (percent) per labelled report;
    a cell a report did not measure shows ``-``."""
    first = next(iter(reports.values()))
    header = ["task", "length", *reports]
    rows = []
    for task, by_length in first["scores"].items():
        for length in by_length:
            cells = []
            for report in reports.values():
                value = report["scores"].get(task, {}).get(length)
                cells.append("-" if value is None else f"{value:.1f}")
            rows.append([task, format_length(int(length)), *cells])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [header, *rows]
    )

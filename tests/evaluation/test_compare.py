"""eval-long reports side by side: every cell of the first report, a column per report, gaps shown."""

from __future__ import annotations

import json

from llamafactory_zebra.cli.main import main
from llamafactory_zebra.evaluation.compare import comparison_table


def _report(scores):
    return {"scores": scores}


def test_rows_are_task_by_length_and_columns_the_reports():
    table = comparison_table(
        {
            "before": _report({"niah_single": {"1024": 0.0, "16384": 0.0}, "variable_tracking": {"1024": 20.0}}),
            "after": _report({"niah_single": {"1024": 93.3, "16384": None}}),
        }
    )
    lines = table.splitlines()
    assert lines[0].split() == ["task", "length", "before", "after"]
    assert lines[1].split() == ["niah_single", "1K", "0.0", "93.3"]
    assert lines[2].split() == ["niah_single", "16K", "0.0", "-"]
    assert lines[3].split() == ["variable_tracking", "1K", "20.0", "-"]


def test_cli_names_a_missing_report_and_the_label_format(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "report.json").write_text(json.dumps(_report({"niah_single": {"1024": 50.0}})))
    assert main(["eval-long", "compare", f"x={tmp_path / 'a'}"]) == 0
    assert "niah_single  1K" in capsys.readouterr().out
    assert main(["eval-long-compare", f"x={tmp_path / 'a'}"]) == 0  # the alias, the spelling before the group
    assert "niah_single  1K" in capsys.readouterr().out
    assert main(["eval-long", "compare", f"y={tmp_path / 'missing'}"]) == 2
    assert "no eval-long report" in capsys.readouterr().err
    assert main(["eval-long-compare", str(tmp_path / "a")]) == 2
    assert "LABEL=PATH" in capsys.readouterr().err

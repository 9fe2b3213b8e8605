"""A miniature of ``scripts/longctx_quickstart.sh``: the shipped script and YAMLs, unmodified, with a few
rows, one training step per stage, one eval-long cell and a one-cell learning curve, so the script and its
data generator cannot rot.
The full run is a benchmark (docs/benchmarks.md), not a test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("recipe, prefix", [("passkey", "zebra"), ("needles", "needles")])
def test_miniature_runs_init_data_eval_train_eval_and_prints_the_table(tmp_path, recipe, prefix):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "longctx_quickstart.sh", tmp_path / "scripts")
    shutil.copytree(ROOT / "examples" / "longctx", tmp_path / "examples" / "longctx")
    env = {
        **os.environ,
        "VENV": str(Path(sys.prefix)),
        "RECIPE": recipe,
        "NIAH_SHORT_ROWS": "3",
        "NIAH_SHORT_LENGTHS": "300-500",
        "NIAH_MID_ROWS": "2",
        "NIAH_LONG_ROWS": "2",
        "OMP_NUM_THREADS": "1",
        "SHORT_ROWS": "6",
        "SHORT_LENGTHS": "150-512",
        "MID_ROWS": "2",
        "MID_LENGTHS": "300-500",
        "LONG_ROWS": "2",
        "LONG_LENGTHS": "600-1000",
        "EVAL_LENGTHS": "1k",
        "EVAL_SAMPLES": "1",
        "EVAL_TASKS": "passkey",
        "CURVE_LENGTHS": "1k",
        "CURVE_SAMPLES": "1",
        "TRAIN_ARGS": "max_steps=1 cutoff_len=1024 save_steps=1",
    }
    result = subprocess.run(
        ["bash", "scripts/longctx_quickstart.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = tmp_path / "saves" / "longctx"
    assert "wrote 6 rows" in result.stdout and "wrote 2 rows" in result.stdout
    assert ("wrote 3 rows" in result.stdout) == (recipe == "needles")  # the needle rows, for that recipe only
    for stage in ("model and data", "eval-long before", "stage 1", "stage 2", "eval-long after", "learning curve"):
        assert f"[stage] {stage}: " in result.stdout
    table = result.stdout.split("Before -> after", 1)[1]
    assert "passkey  1K" in table and "before" in table and "after" in table
    for run in ("eval_before", "eval_after"):
        report = json.loads((out / run / "report.json").read_text())
        assert report["scores"]["passkey"]["1024"] is not None
        assert (out / run / "depth_heatmap.png").stat().st_size > 0
    for stage in (f"{prefix}-stage1", f"{prefix}-stage2"):
        assert (out / stage / "model.safetensors").is_file()
    assert json.loads((out / f"{prefix}-stage2" / "config.json").read_text())["max_position_embeddings"] == 16384
    # The curve: the init model, then each stage's one checkpoint, on a token axis that grows across stages.
    curve = json.loads((out / "curve" / "curve.json").read_text())
    models = [Path(point["model"]).parts[-2:] for point in curve["points"]]
    stages = [(f"{prefix}-stage1", "checkpoint-1"), (f"{prefix}-stage2", "checkpoint-1")]
    assert models == [("longctx", "zebra-init"), *stages]
    tokens = [point["tokens"] for point in curve["points"]]
    assert tokens[0] == 0 < tokens[1] < tokens[2]
    assert curve["points"][-1]["scores"]["passkey"]["1024"] is not None
    assert (out / "curve" / "curve.png").stat().st_size > 0

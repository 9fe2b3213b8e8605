"""The learning curve's points: checkpoints in step order, on a token axis added up over stages."""

from __future__ import annotations

import json

import pytest

from llamafactory_zebra.evaluation.curve import plot_curves, run_points, score_points


def _checkpoint(stage, step, tokens):
    path = stage / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step, "num_input_tokens_seen": tokens}))
    return path


def _final(stage, step, tokens=None):
    state = {"global_step": step} | ({"num_input_tokens_seen": tokens} if tokens else {})
    (stage / "trainer_state.json").write_text(json.dumps(state))


def test_points_follow_steps_and_add_up_the_stages_tokens(tmp_path):
    one, two = tmp_path / "stage1", tmp_path / "stage2"
    for step in (20, 5, 10):  # made out of order: steps, not names, order the points
        _checkpoint(one, step, 1000 * step)
    _final(one, 20)
    _checkpoint(two, 4, 400)
    _checkpoint(two, 8, 800)
    _final(two, 9, 900)  # the final weights, one step after the last checkpoint
    (two / "checkpoint-12").mkdir()  # a checkpoint cut short (no trainer_state.json) is not a point
    points = run_points("init", [one, two])
    assert [(p.model.rsplit("/", 1)[-1], p.tokens) for p in points] == [
        ("init", 0),
        ("checkpoint-5", 5000),
        ("checkpoint-10", 10000),
        ("checkpoint-20", 20000),
        ("checkpoint-4", 20400),
        ("checkpoint-8", 20800),
        ("stage2", 20900),
    ]
    scored = score_points(points, lambda model: {"passkey": {"2048": 100.0 if "stage2" in model else 0.0}})
    assert [point["scores"]["passkey"]["2048"] for point in scored] == [0, 0, 0, 0, 100, 100, 100]
    assert plot_curves({"zebra": scored, "dense": scored}, tmp_path / "curve.png", "t").stat().st_size > 1000


def test_a_run_without_checkpoints_or_token_counts_is_refused_with_the_fix(tmp_path):
    stage = tmp_path / "stage"
    stage.mkdir()
    with pytest.raises(ValueError, match="save_strategy: steps and save_steps"):
        run_points("init", [stage])
    _checkpoint(stage, 10, 0)
    with pytest.raises(ValueError, match="include_num_input_tokens_seen: true"):
        run_points("init", [stage])
    (stage / "checkpoint-10" / "trainer_state.json").write_text(json.dumps({"num_input_tokens_seen": 5}))
    _final(stage, 15)  # final weights without a token count
    with pytest.raises(ValueError, match="include_num_input_tokens_seen: true"):
        run_points("init", [stage])
    with pytest.raises(FileNotFoundError, match="no such training output directory"):
        run_points("init", [tmp_path / "missing"])

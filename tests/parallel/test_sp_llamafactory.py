"""End to end: ``llamafactory-cli train`` with ``sequence_parallel_size: 2`` on two CPU processes (ZeRO-3,
gloo) logs the same per-step losses as the one-process run of the same YAML, even when one of its ranks is
killed (``kill -9``) between two saves and the same command is run again: it must resume from the last
complete checkpoint, not from the save the kill cut short. Uses ``examples/sp/tiny_sp2_zero3_cpu.yaml``
with a freshly written tiny model.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from llamafactory_cli import leave_a_partial_save, train_until_then_kill_rank_1
from repo_paths import REPO

EXAMPLE = REPO / "examples" / "sp" / "tiny_sp2_zero3_cpu.yaml"
STEPS, SAVE_AT = 10, 5
LOSS_TOLERANCE = 1e-4


def _launch(config: dict, path: Path, processes: int, port: int) -> subprocess.Popen:
    path.write_text(yaml.safe_dump(config))
    env = dict(os.environ, FORCE_TORCHRUN="1", NPROC_PER_NODE=str(processes), MASTER_PORT=str(port))
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cli = Path(sys.executable).with_name("llamafactory-cli")
    log = open(path.with_suffix(".log"), "w")
    return subprocess.Popen([str(cli), "train", str(path)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait(process: subprocess.Popen, log: Path) -> None:
    if process.wait(timeout=600) != 0:
        pytest.fail(f"llamafactory-cli failed; last lines of {log}:\n" + "\n".join(log.read_text().splitlines()[-40:]))


def _losses(output_dir: Path) -> dict[int, tuple[float, float]]:
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: (entry["loss"], entry["grad_norm"]) for entry in history if "loss" in entry}


@pytest.mark.slow
def test_sequence_parallel_training_killed_and_resumed_reproduces_one_process_losses(tmp_path, tiny_model_dir):
    base = yaml.safe_load(EXAMPLE.read_text())
    base.update(
        model_name_or_path=str(tiny_model_dir),
        dataset_dir=str(REPO / "examples" / "data"),
        deepspeed=str(REPO / "examples" / "sp" / "ds_z3_fp32_cpu.json"),
        max_steps=STEPS,
        save_steps=SAVE_AT,
    )
    one = {**base, "sequence_parallel_size": 1, "output_dir": str(tmp_path / "sp1")}
    two = {**base, "sequence_parallel_size": 2, "output_dir": str(tmp_path / "sp2")}
    reference_run = _launch(one, tmp_path / "sp1.yaml", 1, 29611)

    # Complete means rank 0's trainer state and both ranks' RNG files: they are written with no barrier between.
    saved = tmp_path / "sp2" / f"checkpoint-{SAVE_AT}"
    complete = [saved / name for name in ("trainer_state.json", "rng_state_0.pth", "rng_state_1.pth")]
    quiet = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    train_until_then_kill_rank_1(two, tmp_path, complete, env=quiet)
    leave_a_partial_save(tmp_path / "sp2", SAVE_AT, 2 * SAVE_AT)
    # The same command again (LLaMA-Factory resumes an existing output_dir when it is not overwritten).
    _wait(_launch({**two, "overwrite_output_dir": False}, tmp_path / "sp2.yaml", 2, 29623), tmp_path / "sp2.log")
    _wait(reference_run, tmp_path / "sp1.log")
    reference, resumed = _losses(tmp_path / "sp1"), _losses(tmp_path / "sp2")

    last_complete = tmp_path / "sp2" / f"checkpoint-{SAVE_AT}"
    assert f"resuming from {last_complete}, the last complete checkpoint" in (tmp_path / "sp2.log").read_text()
    assert sorted(reference) == sorted(resumed) == list(range(1, STEPS + 1))
    for step in reference:
        assert resumed[step][0] == pytest.approx(reference[step][0], abs=LOSS_TOLERANCE), (step, resumed, reference)
        assert resumed[step][1] == pytest.approx(reference[step][1], rel=1e-3), (step, resumed, reference)
    assert len(set(round(loss, 3) for loss, _ in reference.values())) > 3, "training should move the loss"
    assert (tmp_path / "sp2" / f"checkpoint-{2 * SAVE_AT}" / "trainer_state.json").exists()

"""Which checkpoint a restarted run resumes from when the last save was cut short by a crash."""

import json
import types

import pytest
from training_runs import training_run

from llamafactory_zebra.integration.resume import missing_files, resume_from_last_complete_checkpoint


def _checkpoint(root, step, world_size=2, state=True, rng_ranks=None):
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"")
    for rank in range(world_size) if rng_ranks is None else rng_ranks:
        (path / f"rng_state_{rank}.pth").write_bytes(b"")
    if state:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


class _Log:
    def __init__(self):
        self.lines = []

    def warning_rank0(self, line):
        self.lines.append(line)


def test_interrupted_save_never_replaces_the_last_complete_checkpoint(tmp_path):
    two, four = _checkpoint(tmp_path, 2), _checkpoint(tmp_path, 4)
    _checkpoint(tmp_path, 6, state=False)  # killed before rank 0 wrote the trainer state
    _checkpoint(tmp_path, 8, rng_ranks=[0])  # rank 1 died before its RNG file
    assert missing_files(tmp_path / "checkpoint-6", 2) == ["trainer_state.json"]
    assert missing_files(tmp_path / "checkpoint-8", 2) == ["rng_state_1.pth"]
    assert missing_files(four, 2) == []
    log = _Log()
    for chosen in ("checkpoint-8", "checkpoint-6"):
        args = types.SimpleNamespace(resume_from_checkpoint=str(tmp_path / chosen), world_size=2)
        resume_from_last_complete_checkpoint(training_run(training=args, logger=log))
        assert args.resume_from_checkpoint == str(four)
    assert (
        f"resuming from {four}, the last complete checkpoint" in log.lines[-1]
        and "trainer_state.json" in log.lines[-1]
    )
    complete = types.SimpleNamespace(resume_from_checkpoint=str(two), world_size=2)
    resume_from_last_complete_checkpoint(training_run(training=complete, logger=log))
    assert complete.resume_from_checkpoint == str(two) and len(log.lines) == 2


def test_no_complete_checkpoint_to_fall_back_to_stops_the_run(tmp_path):
    _checkpoint(tmp_path, 2, state=False)
    args = types.SimpleNamespace(resume_from_checkpoint=str(tmp_path / "checkpoint-2"), world_size=2)
    with pytest.raises(ValueError, match="incomplete checkpoint.*missing trainer_state.json.*overwrite_output_dir"):
        resume_from_last_complete_checkpoint(training_run(training=args, logger=_Log()))


def test_single_process_and_model_only_saves(tmp_path):
    single = _checkpoint(tmp_path / "a", 2, world_size=0)
    (single / "rng_state.pth").write_bytes(b"")
    assert missing_files(single, 1) == []
    model_only = _checkpoint(tmp_path / "b", 2, rng_ranks=[])  # save_only_model: no RNG files at all
    assert missing_files(model_only, 4) == []

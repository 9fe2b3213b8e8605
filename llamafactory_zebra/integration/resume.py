"""Resume from the last *complete* checkpoint after a crash, never from one that was being written.

transformers 5.6's ``Trainer._save_checkpoint`` writes straight into ``checkpoint-N`` (weights, DeepSpeed
shards, one RNG file per rank, then ``trainer_state.json`` from rank 0, last) with no temporary
directory or rename, and ``get_last_checkpoint`` — which LLaMA-Factory uses to resume an existing
``output_dir`` — picks the highest step whether or not its files are all there. A worker killed during
a save therefore leaves a ``checkpoint-N`` that the next run would try to resume from (and fail on, or
resume without that rank's RNG state). Older checkpoints are rotated away only after a save completes,
so the last good one is still on disk; this module makes the resume use it.
"""

from __future__ import annotations

import os
import re

from ..hparams import TrainingRun

TRAINER_STATE = "trainer_state.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def missing_files(checkpoint: str, world_size: int) -> list[str]:
    """What a finished save leaves and ``checkpoint`` lacks: the trainer state (written last, by rank 0)
    and every rank's RNG state (a save without any RNG file is a ``save_only_model`` one)."""
    present = set(os.listdir(checkpoint))
    missing = [] if TRAINER_STATE in present else [TRAINER_STATE]
    rng_files = {name for name in present if name.startswith("rng_state")}
    if rng_files:
        expected = {"rng_state.pth"} if world_size <= 1 else {f"rng_state_{rank}.pth" for rank in range(world_size)}
        missing += sorted(expected - rng_files)
    return missing


def complete_checkpoints(output_dir: str, world_size: int) -> list[str]:
    """The complete ``checkpoint-N`` directories in ``output_dir``, oldest step first."""
    found = []
    for name in os.listdir(output_dir):
        match = _CHECKPOINT.match(name)
        path = os.path.join(output_dir, name)
        if match and os.path.isdir(path) and not missing_files(path, world_size):
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def resume_step(run: TrainingRun) -> None:
    """For a Zebra checkpoint: resume from the last complete save (the step says why it overrides
    ``resume_from_checkpoint``)."""
    if run.config is not None:
        resume_from_last_complete_checkpoint(run)


def resume_from_last_complete_checkpoint(run: TrainingRun) -> None:
    """Point ``resume_from_checkpoint`` (LLaMA-Factory's automatic choice or the user's) at a complete save.

    An incomplete choice is replaced by the newest complete checkpoint of an earlier step in the same
    directory; with none there the run stops, naming what is missing.
    """
    training_args, logger = run.training, run.logger
    chosen = training_args.resume_from_checkpoint
    if not isinstance(chosen, str) or not os.path.isdir(chosen):
        return
    missing = missing_files(chosen, training_args.world_size)
    if not missing:
        return
    step = _step(chosen)
    earlier = [
        path
        for path in complete_checkpoints(os.path.dirname(os.path.abspath(chosen)), training_args.world_size)
        if step is None or _step(path) < step
    ]
    if not earlier:
        raise ValueError(
            f"{chosen} is an incomplete checkpoint (the save was interrupted; missing {', '.join(missing)}) and "
            "there is no complete one before it to resume from. Remove it, or set overwrite_output_dir: true to "
            "start over."
        )
    training_args.resume_from_checkpoint = earlier[-1]
    logger.warning_rank0(
        f"llamafactory-zebra: {chosen} is incomplete (the save was interrupted; missing {', '.join(missing)}); "
        f"resuming from {earlier[-1]}, the last complete checkpoint. The next save of that step overwrites it."
    )


def _step(path: str) -> int | None:
    match = _CHECKPOINT.match(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else None

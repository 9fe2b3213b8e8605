"""Run a worker on N CPU processes with gloo and collect what each rank measured.

Each worker is ``fn(rank, world, *args) -> dict[str, float]`` (measured errors); the dicts come back
in rank order. A worker exception fails the launch with the worker's traceback. Workers are forked, not
spawned: they inherit the imported torch/transformers/plugin (a spawned worker spends ~10 s importing
them on 2 cores) and run single-threaded.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, fn: Callable, world: int, store_dir: str, args: tuple) -> None:
    os.environ.update(OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        with open(os.path.join(store_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


def launch(fn: Callable, world: int, *args) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory() as store_dir:
        mp.start_processes(_entry, args=(fn, world, store_dir, args), nprocs=world, join=True, start_method="fork")
        results = []
        for rank in range(world):
            with open(os.path.join(store_dir, f"rank{rank}.json")) as f:
                results.append(json.load(f))
    return results


def worst(results: list[dict[str, float]]) -> dict[str, float]:
    """The largest value of each metric over the ranks."""
    return {key: max(result[key] for result in results) for key in results[0]}


def packed_segments(rows: list[list[int]]) -> torch.Tensor:
    """``[B, T]`` segment ids from per-row sample lengths; a negative length is a padding run (id 0)."""
    out = []
    for lengths in rows:
        ids, next_id = [], 1
        for length in lengths:
            ids += [0 if length < 0 else next_id] * abs(length)
            next_id += length > 0
        out.append(ids)
    return torch.tensor(out)


def positions_from_segments(segments: torch.Tensor) -> torch.Tensor:
    """Positions restarting at 0 at every change of segment id (LLaMA-Factory's ``packing`` layout)."""
    index = torch.arange(segments.shape[1]).expand_as(segments)
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    return index - torch.where(starts, index, torch.zeros_like(index)).cummax(-1).values

"""The two size rules of a run's processes, written once: ``world = data_parallel x sequence_parallel``.

The key's parser (``zebra_args``), the launcher, the training-argument checks, ``data inspect``, the
planner and the process groups (``parallel.rank_groups``) all call these, so a run is refused with the same
words wherever the mistake is first seen.
"""

from __future__ import annotations


def check_sequence_parallel_size(sp: object, world: int | None = None) -> None:
    """``sequence_parallel_size`` is an integer ≥ 1 that divides the number of processes (when ``world`` is known).

    ``ValueError`` naming the key, the value and, for a size that does not divide, the sizes that would.
    """
    if not isinstance(sp, int) or isinstance(sp, bool) or sp < 1:
        raise ValueError(f"sequence_parallel_size must be a positive integer, got {sp!r}")
    if world is not None and (world < 1 or world % sp):
        raise ValueError(
            f"sequence_parallel_size={sp} does not divide the number of processes ({world}); "
            f"use one of {[d for d in range(1, world + 1) if world % d == 0]} or change the process count"
        )


def data_parallel_size(world: int | None, sp: int) -> int:
    """Ranks that read different batches: the processes divided by the ranks sharing one sequence.

    ``world`` defaults to one sequence-parallel group (``sp`` processes).
    """
    world = sp if world is None else world
    check_sequence_parallel_size(sp, world)
    return world // sp

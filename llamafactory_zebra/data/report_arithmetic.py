"""The ``data inspect`` report's arithmetic: packed-sequence counts and length percentiles from token lengths.

Written out here because LLaMA-Factory only does this inside ``datasets.map``: its
``PackedSupervisedDatasetProcessor`` packs each *map batch* (``preprocessing_batch_size`` rows,
split first into ``preprocessing_num_workers`` contiguous shards) on its own with
``greedy_knapsack``, so the packed-sequence count depends on the batching, not just the lengths.
The knapsack itself is LLaMA-Factory's function, called as is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from llamafactory.data.processor.processor_utils import greedy_knapsack

PERCENTILES = (50, 90, 99)


def contiguous_shards(num_rows: int, num_proc: int | None) -> list[range]:
    """The row ranges ``datasets.Dataset.map(num_proc=...)`` hands to its workers (``shard(contiguous=True)``)."""
    shards = max(1, min(num_proc or 1, num_rows))
    div, mod = divmod(num_rows, shards)
    ranges = []
    for index in range(shards):
        start = div * index + min(index, mod)
        ranges.append(range(start, start + div + (1 if index < mod else 0)))
    return ranges


def map_batches(num_rows: int, batch_size: int, num_proc: int | None) -> list[range]:
    """Row ranges of every batch ``map(batched=True, batch_size=..., num_proc=...)`` processes."""
    batches = []
    for shard in contiguous_shards(num_rows, num_proc):
        for start in range(shard.start, shard.stop, batch_size):
            batches.append(range(start, min(start + batch_size, shard.stop)))
    return batches


def count_packs(lengths: Sequence[int | None], batches: Sequence[range], capacity: int) -> int:
    """Packed sequences for rows with these token lengths (``None`` = dropped row), batch by batch."""
    packs = 0
    for batch in batches:
        kept = [min(lengths[i], capacity) for i in batch if lengths[i] is not None]
        packs += len(greedy_knapsack(kept, capacity))
    return packs


def length_summary(lengths: Sequence[int]) -> dict[str, float]:
    """Percentiles (numpy's linear interpolation), mean and max of the token lengths."""
    if not lengths:
        return {}
    values = np.asarray(lengths, dtype=np.float64)
    summary = {f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES}
    summary["mean"] = float(values.mean())
    summary["max"] = float(values.max())
    return summary

"""Cutting a batch of independent sequences into chunks so that one Python loop serves all of them.

The gated delta rule is a recurrence *between* chunks and dense algebra *within* a chunk. Chunks never
straddle a sequence border: every sequence is cut into ``ceil(length / C)`` chunks and its last chunk is
zero-padded (a padded token has k = v = q = 0, beta = 0, g = 0, so it leaves the state untouched).

The recurrence then runs in *steps*: step ``j`` advances the ``j``-th chunk of every sequence that has
one. Sequences are sorted by chunk count (longest first), and chunks are stored step-major, so at step
``j`` the active sequences are a prefix ``[:m_j]`` of the state tensor and their chunks a contiguous
range of the chunk tensor: the loop does slicing only, no gathers. A plain batch of B rows is B
sequences of equal length. With chunk size 1 the same plan drives the token-by-token recurrence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ChunkPlan:
    chunk_size: int
    num_tokens: int
    num_chunks: int
    order: torch.Tensor
    """``[N]``: sorted position -> sequence index (state rows are kept in this order)."""
    in_order: bool
    """``order`` is the identity (no sequence has more chunks than one before it): no final reordering."""
    token_index: torch.Tensor
    """``[num_chunks * C]``: flat token read into each chunk slot; ``num_tokens`` marks padding."""
    token_slot: torch.Tensor
    """``[num_tokens]``: chunk slot holding each token (inverse of ``token_index``)."""
    steps: tuple[tuple[int, int], ...]
    """Per step: (first chunk id, number of active sequences)."""
    padded: bool
    """Some chunk slot holds no token (a sequence's length is not a multiple of C)."""

    def to_chunks(self, x: torch.Tensor) -> torch.Tensor:
        """``[num_tokens, H, D]`` -> ``[num_chunks, H, C, D]`` with zeros in padding slots (one gather)."""
        heads = x.shape[1]
        rows = self.token_index.view(-1, 1, self.chunk_size) * heads + torch.arange(heads, device=x.device)[:, None]
        padding = rows.flatten() >= self.num_tokens * heads
        chunks = x.reshape(-1, x.shape[-1]).index_select(0, rows.flatten().masked_fill(padding, 0))
        if self.padded:  # zero the padding rows alone, not a pass over every row
            chunks.index_fill_(0, padding.nonzero().flatten(), 0)
        return chunks.view(self.num_chunks, heads, self.chunk_size, x.shape[-1])

    def from_chunks(self, chunks: torch.Tensor) -> torch.Tensor:
        """``[num_chunks, H, C, D]`` -> ``[num_tokens, H, D]`` (drops padding, one gather)."""
        heads, size = chunks.shape[1], self.chunk_size
        chunk, slot = self.token_slot // size, self.token_slot % size
        rows = (chunk[:, None] * heads + torch.arange(heads, device=chunks.device)) * size + slot[:, None]
        return chunks.reshape(-1, chunks.shape[-1]).index_select(0, rows.flatten()).view(-1, heads, chunks.shape[-1])


def make_chunk_plan(starts: torch.Tensor, lengths: torch.Tensor, chunk_size: int, device: torch.device) -> ChunkPlan:
    """Build the plan from per-sequence ``starts`` / ``lengths`` (CPU int64, see ``segment_bounds``)."""
    num_tokens = int(lengths.sum().item())
    chunks_per_seq = (lengths + chunk_size - 1) // chunk_size
    order = torch.sort(chunks_per_seq, descending=True, stable=True).indices
    sorted_chunks, sorted_starts, sorted_lengths = chunks_per_seq[order], starts[order], lengths[order]
    max_chunks = int(sorted_chunks[0].item()) if len(order) else 0

    active = (sorted_chunks[None, :] > torch.arange(max_chunks)[:, None]).sum(1)
    first = torch.cumsum(active, 0) - active
    step_of_chunk = torch.repeat_interleave(torch.arange(max_chunks), active)
    rank_of_chunk = torch.arange(int(active.sum().item())) - torch.repeat_interleave(first, active)

    chunk_start = sorted_starts[rank_of_chunk] + step_of_chunk * chunk_size
    chunk_end = (sorted_starts + sorted_lengths)[rank_of_chunk]
    positions = chunk_start[:, None] + torch.arange(chunk_size)[None, :]
    valid = positions < chunk_end[:, None]
    token_index = torch.where(valid, positions, num_tokens).flatten()
    token_slot = torch.empty(num_tokens, dtype=torch.int64)
    token_slot[positions[valid]] = torch.nonzero(valid.flatten()).flatten()

    return ChunkPlan(
        chunk_size=chunk_size,
        num_tokens=num_tokens,
        num_chunks=len(step_of_chunk),
        order=order.to(device),
        in_order=bool(torch.equal(order, torch.arange(len(order)))),
        token_index=token_index.to(device),
        token_slot=token_slot.to(device),
        steps=tuple(zip(first.tolist(), active.tolist(), strict=True)),
        padded=bool((~valid).any()),
    )

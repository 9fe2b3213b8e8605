"""What one forward pass of a sequence-parallel rank knows about the whole rows it holds a shard of.

The model builds one :class:`SequenceParallelContext` per forward (one small all-gather of the
position ids / segment-id mask) and hands it to every mixer. A mixer keeps its own math and asks the
context for the cross-rank pieces: the convolution halo, the GDN state entering the shard, the
Ulysses attention wrapper. Every rank holds an equal, contiguous slice ``[offset, offset + T_local)``
of each of the ``B`` rows.

Sample borders are "runs": maximal stretches of one segment id in a row (padding runs included), the
same borders the single-process model derives, so SP and one process isolate exactly the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch

from ..ops import cu_seqlens_from_segment_ids
from .attention import ulysses_attention
from .collectives import gather_sequence
from .gdn import chunk_gated_delta_rule_sp, conv_halo_states
from .layout import SequenceParallelLayout


def run_ids(segment_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` ids 1, 2, 3… that change wherever ``segment_ids`` changes along the row."""
    starts = torch.ones_like(segment_ids, dtype=torch.long)
    starts[:, 1:] = (segment_ids[:, 1:] != segment_ids[:, :-1]).long()
    return starts.cumsum(-1)


@dataclass
class SequenceParallelContext:
    layout: SequenceParallelLayout
    global_segment_ids: torch.Tensor  # [B, T] over whole rows: 0 = padding, else one id per sample

    def __post_init__(self) -> None:
        batch, length = self.global_segment_ids.shape
        self.batch = batch
        self.shard = self.layout.shard(length)
        self.local_length = length // self.layout.size
        self.offset = self.shard.start
        self.global_runs = run_ids(self.global_segment_ids)

    @classmethod
    def from_local_inputs(
        cls,
        layout: SequenceParallelLayout,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        segment_rule: Callable[[torch.Tensor | None, torch.Tensor], torch.Tensor | None],
    ) -> SequenceParallelContext:
        """Gather this batch's position ids (and 2-D mask) over the SP group and apply the model's own
        ``segment_rule`` (``packed_segment_ids``) to whole rows, so a shard that starts mid-sample is not
        mistaken for a new sample. ``None`` from the rule (nothing packed) means one sample per row."""
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError(
                "sequence parallelism takes a 2-D attention_mask (0/1 or neat-packing segment ids), got "
                f"{attention_mask.dim()}-D; Zebra builds block-diagonal masks itself"
            )
        full_positions = gather_sequence(position_ids.long(), layout.group)
        full_mask = None if attention_mask is None else gather_sequence(attention_mask.long(), layout.group)
        segments = segment_rule(full_mask, full_positions)
        if segments is None:
            segments = torch.ones_like(full_positions) if full_mask is None else (full_mask != 0).long()
        return cls(layout=layout, global_segment_ids=segments)

    @cached_property
    def local_segment_ids(self) -> torch.Tensor:
        return self.global_segment_ids[:, self.shard]

    @cached_property
    def local_runs(self) -> torch.Tensor:
        return self.global_runs[:, self.shard]

    @cached_property
    def cu_seqlens(self) -> torch.Tensor:
        """Borders of the local runs over the flattened ``B * T_local`` tokens (a new run at each row start)."""
        return cu_seqlens_from_segment_ids(self.local_runs)

    @cached_property
    def continues(self) -> torch.Tensor:
        """``[B]`` bool: the row's first local token belongs to the same sample as the previous rank's last."""
        if self.offset == 0:
            return torch.zeros(self.batch, dtype=torch.bool, device=self.global_runs.device)
        return self.global_runs[:, self.offset - 1] == self.global_runs[:, self.offset]

    @cached_property
    def continued_tokens(self) -> torch.Tensor:
        """``[B, T_local]`` bool: tokens of a sample that began on an earlier rank (the row's first local run)."""
        return self.continues[:, None] & (self.local_runs == self.local_runs[:, :1])

    @cached_property
    def row_first_and_last_run(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Index (into the local ``cu_seqlens`` runs) of each row's first and last run."""
        starts = self.cu_seqlens[:-1].long()
        row_starts = torch.arange(self.batch, device=starts.device) * self.local_length
        first = torch.searchsorted(starts, row_starts)
        last = torch.searchsorted(starts, row_starts + self.local_length) - 1
        return first, last

    def halo_mask(self, width: int) -> torch.Tensor:
        """``[B, width]``: which of the ``width`` tokens before this shard belong to the sample it continues."""
        positions = torch.arange(self.offset - width, self.offset, device=self.global_runs.device)
        inside = positions >= 0
        runs = self.global_runs[:, positions.clamp(min=0)]
        same = runs == self.global_runs[:, self.offset : self.offset + 1]
        return same & inside & self.continues[:, None]

    def conv_initial_states(self, features: tuple[torch.Tensor, ...], width: int) -> tuple[torch.Tensor, ...]:
        """``initial_state`` for ``ops.causal_conv1d`` of each flattened ``[1, B * T_local, D]`` feature."""
        return conv_halo_states(self, features, width)

    def chunk_gated_delta_rule(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kw):
        """Drop-in for ``ops.chunk_gated_delta_rule`` on this rank's shard (see ``gdn.py``)."""
        return chunk_gated_delta_rule_sp(
            self,
            q,
            k,
            v,
            g,
            beta,
            scale=scale,
            initial_state=initial_state,
            output_final_state=output_final_state,
            **kw,
        )

    def attention(self, core_attention, attn_implementation: str | None):
        """Wrap a transformers attention function so it runs over whole rows for a slice of the heads."""
        return ulysses_attention(self, core_attention, attn_implementation)

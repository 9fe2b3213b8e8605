"""Packed-sample borders from LLaMA-Factory's packing (position_ids) and neat_packing (segment-id masks)."""

import doctest

import pytest
import torch

from llamafactory_zebra import packing
from llamafactory_zebra.ops import chunk_gated_delta_rule
from llamafactory_zebra.packing import (
    cu_seqlens_from_segment_ids,
    packed_segment_ids,
    sample_starts_from_position_ids,
    segment_ids_from_position_ids,
)
from llamafactory_zebra.parallel import context as sp_context


def cu_seqlens_from_position_ids(position_ids):
    """Borders of a ``packing`` batch read from ``position_ids`` alone (padding: one-token segments)."""
    return cu_seqlens_from_segment_ids(segment_ids_from_position_ids(position_ids))


@pytest.mark.parametrize("module", [packing, sp_context], ids=lambda m: m.__name__)
def test_worked_examples_in_the_docstrings_hold(module):
    """Every packing helper documents an input -> output example; they are run here."""
    results = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert results.attempted >= (17 if module is packing else 5)
    assert results.failed == 0


def test_position_ids_restarts_and_rows_are_borders():
    # Row 0: samples of 3 and 2 tokens, then two padding tokens (LLaMA-Factory pads with position 0).
    # Row 1: one sample of 4 then one of 3; the row start is a border even though row 0 ended mid-run.
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 0, 0], [0, 1, 2, 3, 0, 1, 2]])
    cu = cu_seqlens_from_position_ids(position_ids)
    assert cu.dtype == torch.int32
    assert cu.tolist() == [0, 3, 5, 6, 7, 11, 14]
    assert packed_segment_ids(None, position_ids) is not None


def test_position_ids_one_dimensional_and_shard_starting_mid_sample():
    assert cu_seqlens_from_position_ids(torch.tensor([0, 1, 2, 3])).tolist() == [0, 4]
    assert packed_segment_ids(None, torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]])) is None
    # A sequence-parallel shard that starts inside a sample, then a new sample starts.
    assert cu_seqlens_from_position_ids(torch.tensor([[4096, 4097, 4098, 0, 1]])).tolist() == [0, 3, 5]
    assert sample_starts_from_position_ids(torch.tensor([[7, 8, 0]])).tolist() == [[True, False, True]]


def test_segment_ids_neat_packing_with_padding_isolated():
    segment_ids = torch.tensor([[1, 1, 2, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1]])
    cu = cu_seqlens_from_segment_ids(segment_ids)
    assert cu.dtype == torch.int32
    assert cu.tolist() == [0, 2, 5, 7, 14, 16, 21]
    # A plain 0/1 (or bool) attention mask: real tokens one segment, the padding another.
    assert cu_seqlens_from_segment_ids(torch.tensor([[True, True, False]])).tolist() == [0, 2, 3]


def test_packed_gdn_equals_each_sample_alone():
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 0, 1, 2, 3, 4, 5]])
    cu = cu_seqlens_from_position_ids(position_ids)
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 16, 2, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 16, 2, 6, generator=gen, dtype=torch.float64)
    g = -torch.rand(1, 16, 2, generator=gen, dtype=torch.float64)
    beta = torch.rand(1, 16, 2, generator=gen, dtype=torch.float64)
    o, _ = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    bounds = cu.tolist()
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        part = [t[:, start:end] for t in (q, k, v, g, beta)]
        alone, _ = chunk_gated_delta_rule(*part, use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(o[:, start:end], alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "fn, value, message",
    [
        (cu_seqlens_from_position_ids, torch.tensor([[0.0, 1.0]]), "must hold integers"),
        (cu_seqlens_from_position_ids, torch.zeros(2, 3, 4, dtype=torch.long), r"shape \[B, T\]"),
        (cu_seqlens_from_position_ids, torch.zeros(2, 0, dtype=torch.long), "T > 0"),
        (sample_starts_from_position_ids, [0, 1, 2], "must be a torch.Tensor"),
        (cu_seqlens_from_segment_ids, torch.tensor([[1, 1, -1]]), r"-1 at \[0, 2\]"),
    ],
)
def test_invalid_inputs_raise(fn, value, message):
    with pytest.raises(ValueError, match=message):
        fn(value)

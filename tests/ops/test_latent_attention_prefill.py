"""The CPU latent prefill (``ops/latent_attention/prefill.py``) against the plain reference.

Same paged problems as the reference's tests (shuffled pages, NaN in every row no request owns), with
whole prompts, chunks after cached context, single queries and requests without queries in one batch.
Both of its ways run: the whole context into sdpa (the default at these sizes; small score tiles make
several masked query blocks), and key blocks (``EXPANDED_ELEMENTS`` 0) small enough that every request
goes through several of them (skipped, masked on the diagonal, fully visible) and several query blocks,
where the expand callable sees only bounded blocks of rows. fp64 and fp32 agree to rounding, bf16 caches
to one bf16 rounding of the output.
"""

from __future__ import annotations

import pytest
import torch

from llamafactory_zebra.ops.latent_attention import latent_prefill_reference, prefill
from llamafactory_zebra.testing.latent_cache import LAYOUTS, SHAPES, make_problem

TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}
QUERY_LENS = {"block16": [1, 7, 16, 0, 33], "block528": [1, 300, 20, 555]}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected.double()).norm() / expected.double().norm())


def prefill_arguments(problem, query_lens, dtype, expand):
    s = problem.shapes
    gen = torch.Generator().manual_seed(9)
    query = 2 * torch.randn(sum(query_lens), s.heads, s.nope_dim + s.rope_dim, generator=gen, dtype=torch.float64)
    query_start_loc = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    positional = (query.to(dtype), problem.cache, problem.block_table, query_start_loc, problem.seq_lens, expand, 0.3)
    keywords = dict(latent_dim=s.latent_dim, rope_dim=s.rope_dim, kv_heads=s.kv_heads, scales_offset=s.scales_offset)
    return positional, keywords


# (EXPANDED_ELEMENTS, KEY_BLOCK_TOKENS, SCORE_ELEMENTS)
BLOCKS = {
    "whole_context": (prefill.EXPANDED_ELEMENTS, prefill.KEY_BLOCK_TOKENS, prefill.SCORE_ELEMENTS),
    "whole_context_query_blocks": (prefill.EXPANDED_ELEMENTS, prefill.KEY_BLOCK_TOKENS, 600),
    "key_blocks": (0, prefill.KEY_BLOCK_TOKENS, prefill.SCORE_ELEMENTS),
    "small_key_blocks": (0, 40, 500),
}


@pytest.mark.parametrize("blocks", sorted(BLOCKS))
@pytest.mark.parametrize("dtype", sorted(TOLERANCE, key=str))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_blocked_prefill_matches_the_reference(shape, layout, dtype, blocks, monkeypatch):
    block_size, lengths = LAYOUTS[layout]
    expanded_elements, key_block, score_elements = BLOCKS[blocks]
    monkeypatch.setattr(prefill, "EXPANDED_ELEMENTS", expanded_elements)
    monkeypatch.setattr(prefill, "KEY_BLOCK_TOKENS", key_block)
    monkeypatch.setattr(prefill, "SCORE_ELEMENTS", score_elements)
    problem = make_problem(SHAPES[shape], lengths, block_size, dtype=dtype)
    expanded_rows = []

    def expand(latent, rope, scales):
        expanded_rows.append(latent.shape[0])
        return problem.expand(latent, rope, scales)

    positional, keywords = prefill_arguments(problem, QUERY_LENS[layout], dtype, expand)
    out = prefill.latent_prefill_cpu(*positional, **keywords)
    if expanded_elements == 0:
        assert max(expanded_rows) <= max(block_size, key_block // block_size * block_size)
    else:
        assert sorted(expanded_rows) == sorted(n for n, q in zip(lengths, QUERY_LENS[layout], strict=True) if q)
    expected = latent_prefill_reference(*positional, **keywords)
    assert out.dtype == dtype and out.shape == expected.shape
    assert not out.isnan().any()
    assert relative_error(out, expected) < TOLERANCE[dtype]


def test_blocked_prefill_without_queries_returns_an_empty_output():
    problem = make_problem(SHAPES["gqa_scaled"], [3, 4], 16)
    positional, keywords = prefill_arguments(problem, [0, 0], torch.float64, problem.expand)
    out = prefill.latent_prefill_cpu(*positional, **keywords)
    assert out.shape == (0, problem.shapes.heads, problem.shapes.v_dim)

"""The CPU latent decode (``ops/latent_attention/cpu_decode.py``) against the plain reference.

Same paged problems as the reference's tests (shuffled pages, NaN in every row no request owns): fp64 and
fp32 must agree to rounding, bf16 caches to one bf16 rounding of the output (both sides compute in fp32
from the same bf16 rows). A small chunk size sends long requests through the online-softmax merge,
across page borders and with a last chunk shorter than the others.
"""

from __future__ import annotations

import pytest
import torch

from llamafactory_zebra.ops.latent_attention import cpu_decode, latent_decode_reference
from llamafactory_zebra.testing.latent_cache import LAYOUTS, SHAPES, make_problem

TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected.double()).norm() / expected.double().norm())


def decode_inputs(problem, dtype):
    s = problem.shapes
    gen = torch.Generator().manual_seed(5)
    query = 2 * torch.randn(len(problem.lengths), s.heads, s.nope_dim + s.rope_dim, generator=gen, dtype=torch.float64)
    q_latent, q_rope = problem.absorb(query)
    return (
        q_latent.to(dtype),
        q_rope.to(dtype),
        problem.cache,
        problem.block_table,
        problem.seq_lens,
        0.3,
        s.kv_heads,
        s.scales_offset,
    )


@pytest.mark.parametrize("chunk_tokens", [cpu_decode.DECODE_CHUNK_TOKENS, 40])
@pytest.mark.parametrize("dtype", sorted(TOLERANCE, key=str))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_cpu_decode_matches_the_reference(shape, layout, dtype, chunk_tokens, monkeypatch):
    block_size, lengths = LAYOUTS[layout]
    monkeypatch.setattr(cpu_decode, "DECODE_CHUNK_TOKENS", chunk_tokens)
    problem = make_problem(SHAPES[shape], lengths, block_size, dtype=dtype)
    inputs = decode_inputs(problem, dtype)
    out = cpu_decode.latent_decode_cpu(*inputs)
    expected = latent_decode_reference(*inputs)
    assert out.dtype == dtype and out.shape == expected.shape
    assert not out.isnan().any()
    assert relative_error(out, expected) < TOLERANCE[dtype]


def test_cpu_decode_refuses_what_the_reference_refuses():
    problem = make_problem(SHAPES["gqa_scaled"], [3, 4], 16)
    inputs = list(decode_inputs(problem, torch.float64))
    inputs[6] = 4  # kv_heads
    with pytest.raises(ValueError, match="kv_heads 4 does not divide the 6 query heads"):
        cpu_decode.latent_decode_cpu(*inputs)

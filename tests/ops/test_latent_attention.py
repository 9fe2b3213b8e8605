"""The plain latent-MLA attention (``ops/latent_attention/reference.py``) against independent dense attention.

The dense side never sees the paged cache: per request and query head it builds the expanded keys
``[w_nope ⊙ W_UK c ; rope] · s`` and values ``W_UV c`` from the tokens' own tensors and the explicit
matrices (``testing/latent_cache.py``), and runs textbook softmax attention in fp64. The latent side reads
the shuffled pages (NaN in every row no request owns); decode gets queries absorbed into latent space and
its output goes through ``W_UV`` afterwards. Also checked against the transformers model's own functions
(``layers/mla_decode.py``'s absorbed decode and per-key-head prefill) on a ``ZebraMLA`` layer.
"""

from __future__ import annotations

import pytest
import torch

from llamafactory_zebra import ZebraConfig
from llamafactory_zebra.layers import mla_decode
from llamafactory_zebra.layers.mla import ZebraMLA, eager_attention_forward
from llamafactory_zebra.ops.latent_attention import latent_decode_reference, latent_prefill_reference
from llamafactory_zebra.testing.latent_cache import LAYOUTS, SHAPES, LatentProblem, make_problem

FP64_TOLERANCE = 1e-10


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).norm() / expected.norm())


def dense_attention(problem: LatentProblem, request: int, query: torch.Tensor, scale: float) -> torch.Tensor:
    """``[q, H, v]``: the request's last ``q`` tokens as queries over its expanded keys, causally."""
    s = problem.shapes
    latent, rope = problem.latents[request].double(), problem.ropes[request].double()
    length, queries = latent.shape[0], query.shape[0]
    out = torch.empty(queries, s.heads, s.v_dim, dtype=torch.float64)
    for h in range(s.heads):
        g = h // (s.heads // s.kv_heads)
        key = torch.cat((problem.w_nope * (latent @ problem.w_uk[g].T), rope), dim=-1)
        if problem.scales is not None:
            key = key * problem.scales[request][:, g : g + 1].double()
        value = latent @ problem.w_uv[g].T
        for i in range(queries):
            visible = length - queries + i + 1
            weights = torch.softmax(key[:visible] @ query[i, h].double() * scale, dim=0)
            out[i, h] = weights @ value[:visible]
    return out


def random_queries(problem: LatentProblem, count: int, seed: int) -> torch.Tensor:
    s = problem.shapes
    gen = torch.Generator().manual_seed(seed)
    return 2 * torch.randn(count, s.heads, s.nope_dim + s.rope_dim, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_decode_reference_matches_dense_attention(shape, layout):
    block_size, lengths = LAYOUTS[layout]
    problem = make_problem(SHAPES[shape], lengths, block_size)
    s, scale = problem.shapes, 0.3
    query = random_queries(problem, len(lengths), seed=1)
    q_latent, q_rope = problem.absorb(query)
    context = latent_decode_reference(
        q_latent, q_rope, problem.cache, problem.block_table, problem.seq_lens, scale, s.kv_heads, s.scales_offset
    )
    assert context.shape == (len(lengths), s.heads, s.latent_dim) and context.dtype == torch.float64
    expected = torch.cat([dense_attention(problem, b, query[b : b + 1], scale) for b in range(len(lengths))])
    assert relative_error(problem.unabsorb(context), expected) < FP64_TOLERANCE


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_prefill_reference_matches_dense_attention(shape, layout):
    block_size, lengths = LAYOUTS[layout]
    problem = make_problem(SHAPES[shape], lengths, block_size)
    s, scale = problem.shapes, 0.3
    # Whole prompts, chunks after cached context (crossing block borders), one query, none.
    query_lens = [1, 7, 16, 0, 33][: len(lengths)] if block_size == 16 else [1, 300, 20, 555]
    query_start_loc = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    query = random_queries(problem, sum(query_lens), seed=2)
    out = latent_prefill_reference(
        query,
        problem.cache,
        problem.block_table,
        query_start_loc,
        problem.seq_lens,
        problem.expand,
        scale,
        latent_dim=s.latent_dim,
        rope_dim=s.rope_dim,
        kv_heads=s.kv_heads,
        scales_offset=s.scales_offset,
    )
    starts = query_start_loc.tolist()
    expected = torch.cat(
        [dense_attention(problem, b, query[starts[b] : starts[b + 1]], scale) for b in range(len(lengths))]
    )
    assert out.shape == expected.shape
    assert relative_error(out, expected) < FP64_TOLERANCE


@pytest.mark.parametrize("mla_norm", ["qk_head", "none", "lora"])
@torch.no_grad()
def test_reference_matches_the_transformers_layers_latent_functions(mla_norm):
    """A ``ZebraMLA`` layer's absorbed decode and per-key-head prefill (what the transformers model runs
    over its latent cache) against the paged functions on the same cached rows."""
    torch.manual_seed(0)
    config = ZebraConfig.from_preset("tiny", mla_norm=mla_norm)
    module = ZebraMLA(config, layer_idx=1).double()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    heads, kv_heads = module.num_heads, module.num_key_value_heads
    nope, rope_dim, rank = module.qk_nope_head_dim, module.qk_rope_head_dim, module.kv_lora_rank
    length, queries, block_size = 37, 9, 16
    hidden = torch.randn(1, length, config.hidden_size, dtype=torch.float64)
    latent, rope_key = module.compress(hidden)
    cos, sin = (
        torch.randn(1, length, rope_dim, dtype=torch.float64),
        torch.randn(1, length, rope_dim, dtype=torch.float64),
    )
    rope_entry = module.cache_entry(module.kv_b_proj(latent.squeeze(1)), rope_key, cos, sin)
    rows = torch.cat((latent, rope_entry), dim=-1)[0, 0]  # [S, R + P (+ kv)]
    blocks = -(-length // block_size)
    cache = torch.full((blocks + 1, block_size, rows.shape[1]), float("nan"), dtype=torch.float64)
    order = torch.tensor([2, 0, 3][:blocks])
    flat = cache[order].reshape(-1, rows.shape[1])
    flat[:length] = rows
    cache[order] = flat.view(blocks, block_size, -1)
    block_table = order[None].int()
    seq_lens = torch.tensor([length], dtype=torch.int32)
    scales_offset = rank + rope_dim if mla_norm == "qk_head" else None
    query = torch.randn(1, heads, queries, nope + rope_dim, dtype=torch.float64)

    expected, _ = mla_decode.absorbed_attention(module, query[:, :, -1:], latent, rope_entry, None)
    key_up, value_up = mla_decode.up_projection(module, torch.float64)
    group = heads // kv_heads
    q_nope = query[0, :, -1, :nope]
    if mla_norm == "qk_head":
        q_nope = q_nope * module.k_norm.weight[:nope]
    q_latent = torch.einsum("hn,hnr->hr", q_nope, key_up.repeat_interleave(group, 0))[None]
    context = latent_decode_reference(
        q_latent, query[:, :, -1, nope:], cache, block_table, seq_lens, module.scaling, kv_heads, scales_offset
    )
    decoded = torch.einsum("hr,hvr->hv", context[0], value_up.repeat_interleave(group, 0))
    assert relative_error(decoded.reshape(1, 1, -1), expected) < FP64_TOLERANCE

    def expand(latent_rows, rope_rows, scales):
        entry = rope_rows if scales is None else torch.cat((rope_rows, scales), dim=-1)
        keys, values = module.expand(module.kv_b_proj(latent_rows)[None], entry[None, None])
        return keys[0].transpose(0, 1), values[0].transpose(0, 1)

    visible = mla_decode.decode_visibility(None, 1, queries, length, query.device)
    expected, _ = mla_decode.attention_by_key_head(
        module, query, latent, rope_entry, visible[:, None], kernel=eager_attention_forward
    )
    out = latent_prefill_reference(
        query[0].transpose(0, 1),
        cache,
        block_table,
        torch.tensor([0, queries], dtype=torch.int32),
        seq_lens,
        expand,
        module.scaling,
        latent_dim=rank,
        rope_dim=rope_dim,
        kv_heads=kv_heads,
        scales_offset=scales_offset,
    )
    assert relative_error(out, expected[0]) < FP64_TOLERANCE


def decode_call(problem: LatentProblem, queries: int | None = None, **changes):
    s = problem.shapes
    query = random_queries(problem, len(problem.lengths) if queries is None else queries, seed=3)
    q_latent, q_rope = problem.absorb(query)
    arguments = dict(
        q_latent=q_latent,
        q_rope=q_rope,
        cache=problem.cache,
        block_table=problem.block_table,
        seq_lens=problem.seq_lens,
        scale=1.0,
        kv_heads=s.kv_heads,
        scales_offset=s.scales_offset,
    )
    arguments.update(changes)
    return latent_decode_reference(**arguments)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kv_heads": 4}, "kv_heads 4 does not divide the 6 query heads"),
        ({"queries": 2}, "has 2 queries for 3 requests: decode takes one query per request"),
        ({"seq_lens": torch.tensor([1, 0, 5], dtype=torch.int32)}, "at least its own new token"),
        ({"seq_lens": torch.tensor([1, 999, 5], dtype=torch.int32)}, "exceeds block_table width"),
        ({"scales_offset": 30}, "overlaps the latent and rope key"),
        ({"block_table": torch.zeros(3, 4)}, "block_table must be a 2-D int32/int64 tensor"),
    ],
)
def test_decode_refuses_bad_inputs_by_name(changes, message):
    problem = make_problem(SHAPES["gqa_scaled"], [1, 20, 5], 16)
    with pytest.raises(ValueError, match=message):
        decode_call(problem, **changes)


def test_prefill_refuses_more_queries_than_tokens():
    problem = make_problem(SHAPES["gqa_unscaled"], [3, 4], 16)
    s = problem.shapes
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 3 is shorter than the request's 5 queries"):
        latent_prefill_reference(
            random_queries(problem, 6, seed=0),
            problem.cache,
            problem.block_table,
            torch.tensor([0, 5, 6]),
            problem.seq_lens,
            problem.expand,
            1.0,
            latent_dim=s.latent_dim,
            rope_dim=s.rope_dim,
            kv_heads=s.kv_heads,
            scales_offset=None,
        )

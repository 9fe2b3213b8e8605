"""Plain PyTorch latent-MLA attention over a paged cache: the definition the fast paths are tested against.

Loops over requests, gathers each request's rows block by block, materialises every score; no tiling, no
online softmax, nothing shared between requests. Slow and memory-hungry on purpose: each line is the
formula it implements (``layout.py`` says what a cache row holds).

- decode (absorbed, one query per request): ``score[h, t] = (q_latent[h] · c_t + q_rope[h] · k_rope_t) ·
  s[t, h // group] · scale``, softmax over the request's tokens, output ``Σ_t p[h, t] c_t`` (the caller
  applies ``W_UV``). ``s`` is the cached per-key-head scale (``mla_norm: qk_head``), else 1.
- prefill (expanded): the caller's ``expand`` turns the request's cached latents into keys and values,
  and each query ``i`` of a request with ``context`` earlier tokens attends causally to keys ``<= context
  + i`` (bottom-right aligned), query head ``h`` to key head ``h // group``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .layout import check_decode, check_prefill, compute_dtype, request_rows

Expand = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]


def latent_decode_reference(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    kv_heads: int,
    scales_offset: int | None,
) -> torch.Tensor:
    """``[T, H, R]``: each request's softmax-weighted sum of its cached latents (module docstring)."""
    check_decode(q_latent, q_rope, cache, block_table, seq_lens, kv_heads, scales_offset)
    heads, latent_dim = q_latent.shape[1:]
    rope_dim = q_rope.shape[2]
    dtype = compute_dtype(q_latent, q_rope, cache)
    key_head = torch.arange(heads, device=q_latent.device) // (heads // kv_heads)
    outputs = []
    for b, length in enumerate(seq_lens.tolist()):
        rows = request_rows(cache, block_table, b, length).to(dtype)
        latent, rope = rows[:, :latent_dim], rows[:, latent_dim : latent_dim + rope_dim]
        scores = q_latent[b].to(dtype) @ latent.T + q_rope[b].to(dtype) @ rope.T  # [H, S]
        if scales_offset is not None:
            scales = rows[:, scales_offset : scales_offset + kv_heads]  # [S, kv]
            scores = scores * scales.T[key_head]
        weights = torch.softmax(scores * scale, dim=-1)
        outputs.append(weights @ latent)
    return torch.stack(outputs).to(q_latent.dtype) if outputs else q_latent.new_empty(q_latent.shape)


def latent_prefill_reference(
    query: torch.Tensor,
    cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    expand: Expand,
    scale: float,
    *,
    latent_dim: int,
    rope_dim: int,
    kv_heads: int,
    scales_offset: int | None,
) -> torch.Tensor:
    """``[T, H, Dv]``: each request's queries over all its cached tokens, expanded at once (module docstring)."""
    check_prefill(query, cache, block_table, query_start_loc, seq_lens, latent_dim, rope_dim, kv_heads, scales_offset)
    heads = query.shape[1]
    dtype = compute_dtype(query, cache)
    starts = query_start_loc.tolist()
    outputs = []
    for b, length in enumerate(seq_lens.tolist()):
        start, end = starts[b], starts[b + 1]
        if end == start:
            continue
        rows = request_rows(cache, block_table, b, length)
        scales = None if scales_offset is None else rows[:, scales_offset : scales_offset + kv_heads]
        keys, values = expand(rows[:, :latent_dim], rows[:, latent_dim : latent_dim + rope_dim], scales)
        keys = keys.to(dtype).repeat_interleave(heads // kv_heads, dim=1)  # [S, H, Dqk]
        values = values.to(dtype).repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[start:end].to(dtype), keys) * scale
        context = length - (end - start)
        visible = torch.ones(end - start, length, dtype=torch.bool, device=query.device).tril(context)
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        outputs.append(torch.einsum("hqk,khv->qhv", weights, values))
    if not outputs:
        return no_queries_output(query, cache, expand, latent_dim, rope_dim, kv_heads, scales_offset)
    return torch.cat(outputs).to(query.dtype)


def no_queries_output(
    query: torch.Tensor,
    cache: torch.Tensor,
    expand: Expand,
    latent_dim: int,
    rope_dim: int,
    kv_heads: int,
    scales_offset: int | None,
) -> torch.Tensor:
    """``[0, H, Dv]`` for a call without queries: ``expand`` of no rows says the value width."""
    empty = cache[0, :0]
    scales = None if scales_offset is None else empty[:, scales_offset : scales_offset + kv_heads]
    values = expand(empty[:, :latent_dim], empty[:, latent_dim : latent_dim + rope_dim], scales)[1]
    return query.new_empty(0, query.shape[1], values.shape[-1])

"""How MLA reads a cache of earlier tokens without expanding it: attention functions of the latent cache.

``ZebraMLA`` caches per token the compressed latent and the rope entry (``layers/mla.py``), not expanded
keys and values. With earlier tokens in the cache, the stock path (``mla.expanded_attention``) would expand
every cached latent to ``kv_heads × (nope + v)`` values at every call; the two functions here read the
latents as they are:

- :func:`absorbed_attention`, for a decode step (at most :data:`ABSORBED_DECODE_MAX_QUERIES` new tokens):
  DeepSeek-V2's absorbed path (§2.1.2 of its report). ``kv_b_proj``'s key half is folded into the queries
  and its value half into the output, so a step reads the cached latents once — ``heads × (r + d)`` values
  per cached token. For ``mla_norm: qk_head`` the query nope part is first multiplied by ``k_norm``'s nope
  weights and each score by the cached ``1 / rms_h``, which keeps the absorption exact (the score is linear
  in the latent once the per-token scale is fixed).
- :func:`attention_by_key_head`, for longer chunks (chunked prefill): the latents expanded one key/value
  head at a time into the layer's own attention kernel.

Both are attention functions as transformers writes them (the module first, the query, what the keys come
from, the mask), returning ``[B, q, heads, v]`` or ``[B, q, heads · v]`` and the attention weights
(``output_attentions``); ``mla.mla_attention_function`` chooses among them and the stock path. Both read
``kv_b_proj``'s matrix through :func:`up_projection` (so a LoRA adapter and ZeRO-3 apply);
:func:`decode_visibility` turns the masks the model hands its attention functions into the booleans the
absorbed path (and ``mla.eager_attention_for_maps``) applies.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..configuration_zebra import MLA_NORM_QK_HEAD

# Query lengths that take the absorbed path when a cache holds earlier tokens (one-token decode, and the
# few tokens of assisted/speculative decoding); longer chunks (chunked prefill) expand the latents, one
# key/value head at a time (``attention_by_key_head``).
ABSORBED_DECODE_MAX_QUERIES = 16
# Scores (or mask elements) one attention call of ``attention_by_key_head`` may hold: 2**26 fp32 values are
# 256 MiB, 1024 queries against 64K cached tokens.
CACHED_CHUNK_SCORE_ELEMENTS = 2**26


def up_projection(module: nn.Module, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The matrix ``module.kv_b_proj`` applies, split into its key ``[kv_heads, nope, r]`` and value
    ``[kv_heads, v, r]`` halves.

    Read by calling the module on the identity rather than from ``.weight``: a PEFT LoRA wrapper adds its
    delta only in ``forward`` (``.weight`` is the frozen base), and ZeRO-3 gathers a partitioned weight
    only around its module's ``forward``. ``kv_b_proj`` has no bias, so this is exactly the matrix.
    """
    identity = torch.eye(module.kv_lora_rank, dtype=dtype, device=module.kv_b_proj.weight.device)
    key, value = module.split_heads(module.kv_b_proj(identity)[None])
    return key[0].transpose(1, 2), value[0].transpose(1, 2)


def absorbed_attention(
    module: nn.Module,
    query: torch.Tensor,
    latent: torch.Tensor,
    rope_entry: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the cached latents without expanding them: ``[B, q, heads · v]``, and the attention
    weights ``[B, heads, q, S]``.

    ``query`` ``[B, heads, q, nope + rope]`` with its rope part rotated (the nope part before any key
    weight); ``latent`` ``[B, 1, S, r]`` and ``rope_entry`` as cached. Query head ``h`` reads key/value head
    ``h // groups``, as ``repeat_kv`` pairs them. The weights are the softmax this path computes anyway (the
    scores are exact, not an approximation of the expanded path's), so ``output_attentions`` costs nothing
    here and every attention implementation returns them.
    """
    batch, _, queries, _ = query.shape
    groups, kv_heads = module.num_key_value_groups, module.num_key_value_heads
    nope, rope_dim = module.qk_nope_head_dim, module.qk_rope_head_dim
    query_nope, query_rope = query[..., :nope], query[..., nope:]
    latent = latent.squeeze(1)
    rope_key = rope_entry.squeeze(1)[..., :rope_dim]
    if module.mla_norm == MLA_NORM_QK_HEAD:
        query_nope = query_nope * module.k_norm.weight[:nope]
    query_nope = query_nope.reshape(batch, kv_heads, groups, queries, -1)
    query_rope = query_rope.reshape(batch, kv_heads, groups, queries, -1)
    key_up, value_up = up_projection(module, latent.dtype)
    query_latent = torch.einsum("bkgqn,knr->bkgqr", query_nope, key_up)
    scores = torch.einsum("bkgqr,bsr->bkgqs", query_latent, latent)
    scores = scores + torch.einsum("bkgqd,bsd->bkgqs", query_rope, rope_key)
    if module.mla_norm == MLA_NORM_QK_HEAD:
        inverse_rms = rope_entry.squeeze(1)[..., rope_dim:]
        scores = scores * inverse_rms.transpose(1, 2)[:, :, None, None, :]
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * module.scaling
    visible = decode_visibility(attention_mask, batch, queries, latent.shape[1], scores.device)
    scores = scores.masked_fill(~visible[:, None, None], torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1).to(latent.dtype)
    context = torch.einsum("bkgqs,bsr->bkgqr", weights, latent)
    output = torch.einsum("bkgqr,kvr->bqkgv", context, value_up)
    output = output.reshape(batch, queries, module.num_heads * module.v_head_dim)
    return output, weights.reshape(batch, module.num_heads, queries, -1)


def attention_by_key_head(
    module: nn.Module,
    query: torch.Tensor,
    latent: torch.Tensor,
    rope_entry: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    kernel: Callable,
    output_attentions: bool = False,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chunk of queries over a long cache, expanding the cached latents one key/value head at a time into
    ``kernel`` (the layer's attention function): ``[B, q, heads, v]``, what ``expand`` + ``kernel`` give, and
    with ``output_attentions`` the kernel's weights put back together, ``[B, heads, q, S]`` (the kernel is
    then an eager one: ``mla.expanded_attention_kernel``).

    ``expand`` holds every cached token as ``kv_heads × (nope + v)`` values, plus the key copy and the
    attention function's own copies of K and V: at 64K tokens and the released shapes, gigabytes in
    one layer, so chunked prefill's peak would grow with the context like a one-shot forward's. One
    head at a time holds a ``1 / kv_heads`` share of it, for the same number of operations.
    The queries go in blocks of at most ``CACHED_CHUNK_SCORE_ELEMENTS / cached tokens``: sdpa turns a
    boolean mask into a float one of the same size, and eager builds the scores, so one call for an
    8K-token chunk over 64K cached tokens would hold 2 GiB of either. ``query`` is
    ``[B, heads, q, qk_head_dim]`` (rotated); query head ``h`` reads key head ``h // groups``, as
    ``repeat_kv`` pairs them.
    """
    groups, nope, rope_dim = module.num_key_value_groups, module.qk_nope_head_dim, module.qk_rope_head_dim
    key_up, value_up = up_projection(module, latent.dtype)
    latent, rope_entry = latent.squeeze(1), rope_entry.squeeze(1)
    rope_key = rope_entry[..., :rope_dim]
    queries = query.shape[2]
    # Without a mask the attention function reads the block as causal from its first key: one block.
    block = queries if attention_mask is None else max(1, CACHED_CHUNK_SCORE_ELEMENTS // latent.shape[1])
    outputs, weights = [], []
    for head in range(module.num_key_value_heads):
        key_nope, head_rope = latent @ key_up[head].T, rope_key
        if module.mla_norm == MLA_NORM_QK_HEAD:
            inverse_rms = rope_entry[..., rope_dim + head, None]
            key_nope = module.k_norm.weight[:nope] * (key_nope * inverse_rms).to(key_nope.dtype)
            head_rope = (rope_key * inverse_rms).to(key_nope.dtype)
        key = torch.cat((key_nope, head_rope), dim=-1)[:, None]
        value = (latent @ value_up[head].T)[:, None]
        head_query = query[:, head * groups : (head + 1) * groups]
        blocks, block_weights = [], []
        for start in range(0, queries, block):
            mask = None if attention_mask is None else attention_mask[:, :, start : start + block]
            output, block_weight = kernel(
                module, head_query[:, :, start : start + block], key, value, mask, scaling=module.scaling
            )
            blocks.append(output)
            block_weights.append(block_weight)
        outputs.append(torch.cat(blocks, dim=1))
        if output_attentions:
            weights.append(torch.cat(block_weights, dim=2))
    return torch.cat(outputs, dim=2), torch.cat(weights, dim=1) if output_attentions else None


def decode_visibility(
    attention_mask: torch.Tensor | None, batch: int, queries: int, keys: int, device: torch.device
) -> torch.Tensor:
    """``[B, q, S]`` booleans: which cached keys each new query may read.

    Accepts what the model hands its attention functions: a 4-D boolean or additive mask, a 2-D padding
    mask (FlashAttention-2's convention), or ``None`` (causal, nothing padded).
    """
    causal = torch.ones(queries, keys, dtype=torch.bool, device=device).tril(keys - queries)
    if attention_mask is None:
        return causal.expand(batch, -1, -1)
    if attention_mask.dim() == 2:
        return causal & attention_mask[:, None, -keys:].bool()
    mask = attention_mask[:, 0, -queries:, -keys:]
    return mask if mask.dtype == torch.bool else mask == 0

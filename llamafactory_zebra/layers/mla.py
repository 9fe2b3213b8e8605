"""Multi-head Latent Attention as the released Zebra MLA layers lay it out.

Queries go through a low-rank pair (``q_a_proj`` → ``q_b_proj``); keys and values come from one
compressed latent (``kv_a_proj_with_mqa`` → ``kv_b_proj``) expanded to ``num_key_value_heads`` heads that
each serve ``num_attention_heads / num_key_value_heads`` query heads. RoPE touches only the last
``qk_rope_head_dim`` dims of each q/k head, and the rope part of K is one vector shared by every head.
The decode cache keeps the latent and the rope key — not the expanded K/V — which is the memory saving
the architecture exists for.

RoPE pairs (``config.rope_interleave``): AMD's MLA code, like DeepSeek-V3 with ``rope_interleave: true``,
rotates channel pairs (2j, 2j+1): it de-interleaves the rope dims (``view(d/2, 2).transpose``) and then
applies the half-split rotation, so rotated q and k rope dims come out in de-interleaved order (q·k is
unchanged, both are treated alike). ``rope_interleave: false`` is Qwen3's half-split (j, j+d/2) on the
stored order. The two are one model up to the row permutation [0, 2, …, d-2, 1, 3, …, d-1] of the
rope rows (``tests/model/test_mla_conventions.py``).

Where the norms sit (``config.mla_norm``):

- ``qk_head`` (Qwen3's ``q_norm``/``k_norm``, RMSNorm over each ``qk_head_dim`` = nope + rope head):
  ``q_norm`` on each query head right after ``q_b_proj``, before the nope/rope split and RoPE;
  ``k_norm`` on each key head ``[k_nope_h; k_pe]`` before RoPE. The cache stays un-normalised and the
  key norm is applied after expansion: per token it holds the raw latent, and as "rope key" the rotated
  ``k_norm.weight[nope:] ⊙ k_pe`` (the weight must act before the rotation) followed by one channel per
  key head with ``1 / rms_h``, ``rms_h = sqrt((Σ k_nope_h² + Σ k_pe²) / qk_head_dim + eps)``. A token's
  scale is fixed once it is cached, so it is computed once, from that token's own ``k_nope_h =
  W_uk_h · latent``; ``expand`` returns ``[k_nope_h ⊙ w_nope; rope] / rms_h``.
- ``lora`` (AMD's ``use_lora_layer_norm``): ``q_a_layernorm`` between ``q_a_proj`` and ``q_b_proj``;
  ``kv_a_layernorm`` on the latent before caching (the cache holds the normalised latent).
- ``none``: no norm in the mixer (the Llama-based HyLo models).

Attention, as in transformers' modeling files, is the projections and one call of an attention function,
chosen in one place (:func:`mla_attention_function`):

- no earlier tokens in a cache (training, a prompt's first chunk): the stock path,
  :func:`expanded_attention` — ``kv_b_proj`` expands the latents to keys and values, which go to the
  kernel :func:`expanded_attention_kernel` picks: :func:`eager_attention_forward` (this file, the plain
  reference), transformers' registered function for ``sdpa`` or any other registered name, FlashAttention
  through ``flash_attention.py`` (transformers' FA core without a transformers 5.6.0 bug), and for packed
  rows the kernel registry's ``attention`` op (``kernels.packed_attention``): FlashAttention's
  varlen path, or :func:`flex_sdpa_attention` / :func:`per_segment_sdpa_attention`, which read the samples'
  borders instead of a ``T x T`` mask. Under sequence parallelism the kernel is wrapped by
  ``parallel.attention.ulysses_attention``.
- earlier tokens in the cache: the latent-cache functions of ``mla_decode.py`` — DeepSeek-V2's absorbed
  decode for a few new tokens, one key/value head at a time for longer chunks (FlashAttention takes the
  stock path there). The forward keyword ``mla_cache_path="expand"`` sends cached calls down the stock
  path instead, to test and measure the latent paths against it (``tests/model/test_mla_absorbed_decode.py``,
  ``benchmarks/bench_decode.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import logging

from ..attention_policy import EAGER, FLASH_ATTENTION_BACKENDS
from ..configuration_zebra import MLA_NORM_LORA, MLA_NORM_QK_HEAD, ZebraConfig
from ..kernels import Key, Op, bind, packed_attention_function
from ..ops.packed_attention import flex_packed_attention, per_segment_sdpa
from ..parallel.attention import ulysses_attention
from ..parallel.context import SequenceParallelContext
from ..rope import mla_softmax_scale
from . import mla_decode
from .flash_attention import flash_attention_forward
from .norms import ZebraRMSNorm

logger = logging.get_logger(__name__)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool = False) -> torch.Tensor:
    """Rotate ``x`` ``[B, heads, T, D]`` by ``cos``/``sin`` ``[B, T, D]``.

    ``interleave``: pairs (2j, 2j+1), returned de-interleaved (DeepSeek-V3's / AMD's convention);
    otherwise Qwen3's half-split pairs (j, j+D/2).
    """
    if interleave:
        *lead, dim = x.shape
        x = x.view(*lead, dim // 2, 2).transpose(-1, -2).reshape(*lead, dim)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


def interleaved_to_half_split(dim: int) -> list[int]:
    """Row order [0, 2, …, dim-2, 1, 3, …, dim-1]: interleaved rope rows as half-split ones."""
    return [*range(0, dim, 2), *range(1, dim, 2)]


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    if n_rep == 1:
        return hidden_states
    batch, heads, length, dim = hidden_states.shape
    expanded = hidden_states[:, :, None].expand(batch, heads, n_rep, length, dim)
    return expanded.reshape(batch, heads * n_rep, length, dim)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    key = repeat_kv(key, module.num_key_value_groups)
    value = repeat_kv(value, module.num_key_value_groups)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    weights = weights.to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, weights


def _on_the_borders(kernel: Callable) -> Callable:
    """A transformers attention function for packed rows that runs ``kernel(query, key, value, cu_seqlens,
    scale, dropout)`` on the samples' borders (``cu_seq_lens_q``, as FlashAttention's varlen path takes them)
    instead of a ``T x T`` mask (``ops/packed_attention.py``). Same contract as transformers' functions."""

    @functools.wraps(kernel)
    def attention(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float,
        dropout: float = 0.0,
        cu_seq_lens_q: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        if cu_seq_lens_q is None or attention_mask is not None:
            raise ValueError("packed sdpa attention takes the samples' borders (cu_seq_lens_q) and no attention mask")
        return kernel(query, key, value, cu_seq_lens_q, scaling, dropout), None

    return attention


def _flex_without_dropout(query, key, value, cu_seqlens, scale, dropout):
    if dropout:
        raise ValueError(f"attention_dropout={dropout} on packed rows: flex_attention has no dropout; set it to 0")
    return flex_packed_attention(query, key, value, cu_seqlens, scale)


def _per_segment(query, key, value, cu_seqlens, scale, dropout):
    return per_segment_sdpa(query, key, value, cu_seqlens, scale, dropout)


# Packed rows through ``flex_attention`` with a block mask, or as one causal sdpa call per sample.
flex_sdpa_attention = _on_the_borders(_flex_without_dropout)
per_segment_sdpa_attention = _on_the_borders(_per_segment)
# The attention op's entries that have a function (the dense mask runs the model's own attention function).
bind(
    Op.ATTENTION,
    {
        Key.FLASH_VARLEN: flash_attention_forward,
        Key.FLEX_BLOCK_MASK: flex_sdpa_attention,
        Key.SDPA_PER_SEGMENT: per_segment_sdpa_attention,
    },
)


class ZebraMLA(nn.Module):
    def __init__(self, config: ZebraConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = config.num_key_value_groups
        self.kv_lora_rank = config.kv_lora_rank
        self.qk_nope_head_dim = config.qk_nope_head_dim
        self.qk_rope_head_dim = config.qk_rope_head_dim
        self.qk_head_dim = config.qk_head_dim
        self.v_head_dim = config.v_head_dim
        self.rope_interleave = config.rope_interleave
        self.mla_norm = config.mla_norm
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        self.scaling = mla_softmax_scale(config)

        bias, eps = config.attention_bias, config.rms_norm_eps
        if config.q_lora_rank is None:
            self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.qk_head_dim, bias=bias)
        else:
            self.q_a_proj = nn.Linear(config.hidden_size, config.q_lora_rank, bias=bias)
            if self.mla_norm == MLA_NORM_LORA:
                self.q_a_layernorm = ZebraRMSNorm(config.q_lora_rank, eps=eps)
            self.q_b_proj = nn.Linear(config.q_lora_rank, self.num_heads * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(config.hidden_size, self.kv_lora_rank + self.qk_rope_head_dim, bias=bias)
        if self.mla_norm == MLA_NORM_LORA:
            self.kv_a_layernorm = ZebraRMSNorm(self.kv_lora_rank, eps=eps)
        self.kv_b_proj = nn.Linear(
            self.kv_lora_rank, self.num_key_value_heads * (self.qk_nope_head_dim + self.v_head_dim), bias=False
        )
        self.out_proj = nn.Linear(self.num_heads * self.v_head_dim, config.hidden_size, bias=bias)
        if self.mla_norm == MLA_NORM_QK_HEAD:
            self.q_norm = ZebraRMSNorm(self.qk_head_dim, eps=eps)
            self.k_norm = ZebraRMSNorm(self.qk_head_dim, eps=eps)

    def project_queries(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Queries ``[B, heads, T, qk_head_dim]`` before RoPE (``q_norm`` applied for ``qk_head``)."""
        batch, length, _ = hidden_states.shape
        if self.config.q_lora_rank is None:
            query = self.q_proj(hidden_states)
        else:
            query = self.q_a_proj(hidden_states)
            if self.mla_norm == MLA_NORM_LORA:
                query = self.q_a_layernorm(query)
            query = self.q_b_proj(query)
        query = query.view(batch, length, self.num_heads, self.qk_head_dim)
        if self.mla_norm == MLA_NORM_QK_HEAD:
            query = self.q_norm(query)
        return query.transpose(1, 2)

    def compress(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Latent ``[B, 1, T, r]`` (``kv_a_layernorm`` applied for ``lora``) and the un-rotated rope key
        ``[B, 1, T, d]``."""
        compressed = self.kv_a_proj_with_mqa(hidden_states)
        latent, rope_key = compressed.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        if self.mla_norm == MLA_NORM_LORA:
            latent = self.kv_a_layernorm(latent)
        return latent.unsqueeze(1), rope_key.unsqueeze(1)

    def cache_entry(
        self, new_kv: torch.Tensor, rope_key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """The rope part of what the decode cache holds per token (the latent is cached as it is).

        ``new_kv`` is ``kv_b_proj`` of the new tokens' latents ``[B, T, kv_heads · (nope + v)]``. For
        ``qk_head`` the entry is ``k_norm``'s rope weights times ``k_pe``, rotated, plus one channel per key
        head with that head's ``1 / rms`` (see the module docstring), taken from ``new_kv``'s keys: through
        the module, so a LoRA adapter on ``kv_b_proj`` and ZeRO-3's gathering of its weight both apply.
        """
        if self.mla_norm != MLA_NORM_QK_HEAD:
            return apply_rotary(rope_key, cos, sin, self.rope_interleave)
        compute = torch.promote_types(rope_key.dtype, torch.float32)
        key_nope = self.split_heads(new_kv)[0]
        energy = key_nope.to(compute).pow(2).sum(-1) + rope_key.to(compute).pow(2).sum(-1)
        inverse_rms = torch.rsqrt(energy / self.qk_head_dim + self.k_norm.variance_epsilon)
        weighted = rope_key * self.k_norm.weight[self.qk_nope_head_dim :]
        rotated = apply_rotary(weighted, cos, sin, self.rope_interleave)
        return torch.cat((rotated, inverse_rms.transpose(1, 2).unsqueeze(1).to(rotated.dtype)), dim=-1)

    def split_heads(self, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv_b_proj`` output ``[B, S, kv_heads · (nope + v)]`` → key nope and value ``[B, kv_heads, S, ·]``."""
        kv = kv.unflatten(-1, (self.num_key_value_heads, self.qk_nope_head_dim + self.v_head_dim)).transpose(1, 2)
        return kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)

    def expand(self, kv: torch.Tensor, rope_entry: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv_b_proj`` of the cached latents ``[B, S, ·]`` and the rope entries ``[B, 1, S, ·]`` → keys and
        values ``[B, kv_heads, S, ·]``."""
        key_nope, value = self.split_heads(kv)
        rope_key = rope_entry
        if self.mla_norm == MLA_NORM_QK_HEAD:
            rope_key, inverse_rms = rope_entry.split([self.qk_rope_head_dim, self.num_key_value_heads], dim=-1)
            inverse_rms = inverse_rms.squeeze(1).transpose(1, 2).unsqueeze(-1)
            key_nope = self.k_norm.weight[: self.qk_nope_head_dim] * (key_nope * inverse_rms).to(key_nope.dtype)
            rope_key = (rope_key * inverse_rms).to(key_nope.dtype)
        else:
            rope_key = rope_key.expand(-1, self.num_key_value_heads, -1, -1)
        return torch.cat((key_nope, rope_key), dim=-1), value

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The mixer's output ``[B, T, hidden]`` and, as transformers' attention modules return them, the
        attention weights ``[B, heads, T, keys]`` (``None`` unless the call runs eager attention or reads a
        latent cache: what ``output_attentions`` records, see :func:`mla_attention_function`)."""
        batch, length, _ = hidden_states.shape
        cos, sin = position_embeddings
        sp_context = kwargs.pop("sp_context", None)
        cache_path = kwargs.pop(CACHE_PATH_KEYWORD, LATENT)

        query_nope, query_rope = self.project_queries(hidden_states).split(
            [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1
        )
        query = torch.cat((query_nope, apply_rotary(query_rope, cos, sin, self.rope_interleave)), dim=-1)

        latent, rope_key = self.compress(hidden_states)
        kv = self.kv_b_proj(latent.squeeze(1))
        rope_entry = self.cache_entry(kv, rope_key, cos, sin)
        cached = past_key_values is not None and past_key_values.get_seq_length(self.layer_idx) > 0
        if past_key_values is not None:
            latent, rope_entry = past_key_values.update(latent, rope_entry, self.layer_idx)

        packed = "cu_seq_lens_q" in kwargs or sp_context is not None
        output_attentions = bool(kwargs.get("output_attentions", False))
        attention_interface = mla_attention_function(
            self, query, cached, packed, sp_context, cache_path, output_attentions
        )
        output, weights = attention_interface(
            self,
            query,
            latent,
            rope_entry,
            attention_mask,
            new_kv=None if cached else kv,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        return self.out_proj(output.reshape(batch, length, -1)), weights


# The forward keyword that picks how a call with earlier tokens in the cache attends: LATENT (the default:
# ``mla_decode.py``'s functions) or EXPAND (the stock path, every cached latent expanded to all key/value
# heads at once; to test and measure the latent paths against).
CACHE_PATH_KEYWORD = "mla_cache_path"
LATENT, EXPAND = "latent", "expand"
CACHE_PATHS = (LATENT, EXPAND)


def expanded_attention(
    module: ZebraMLA,
    query: torch.Tensor,
    latent: torch.Tensor,
    rope_entry: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    kernel: Callable,
    new_kv: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The stock path: the latents expanded to keys and values (``kv_b_proj``, ``ZebraMLA.expand``), then
    ``kernel`` (a transformers attention function): ``[B, q, heads, v]`` and the kernel's weights (eager's,
    else ``None``). ``new_kv`` is ``kv_b_proj`` of ``latent`` when the caller already computed it (no
    earlier tokens: the latent is the new tokens')."""
    kv = module.kv_b_proj(latent.squeeze(1)) if new_kv is None else new_kv
    key, value = module.expand(kv, rope_entry)
    return kernel(module, query, key, value, attention_mask, **kwargs)


def eager_attention_for_maps(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`eager_attention_forward` on the mask another implementation was handed, for a call that asks for
    the attention maps (``output_attentions``) while sdpa, FlashAttention or another kernel without weights is
    selected.

    Those kernels never form the weights (transformers' own sdpa and FlashAttention functions warn and return
    ``None``), so such a call runs eager instead, as transformers 4's sdpa attention classes did: the maps
    exist whatever the model was loaded with, at eager's ``T x T`` cost for that call only. The mask is read
    as :func:`mla_decode.decode_visibility` reads it: sdpa's boolean ``[B, 1, q, k]`` mask or ``None``
    (causal, nothing padded), FlashAttention's ``[B, k]`` padding mask.
    """
    batch, _, queries, _ = query.shape
    visible = mla_decode.decode_visibility(attention_mask, batch, queries, key.shape[2], query.device)
    return eager_attention_forward(module, query, key, value, visible[:, None], **kwargs)


def expanded_attention_kernel(
    module: ZebraMLA, packed: bool, query: torch.Tensor, output_attentions: bool = False
) -> Callable:
    """The kernel that attends over expanded keys and values for this call: for packed rows the kernel
    registry's choice (``kernels.packed_attention_function``: FlashAttention varlen, flex or per-sample sdpa
    on the samples' borders, or the dense mask with the model's own function), else eager, then — for a call
    that asks for the attention maps — :func:`eager_attention_for_maps`, else FlashAttention or transformers'
    registered function for the model's ``attn_implementation``. (Packed rows that ask for the maps reach
    this function unpacked: the model hands them the dense block-causal mask instead of the borders.)"""
    implementation = module.config._attn_implementation
    if packed:
        function = packed_attention_function(implementation, query.device.type)
        if function is not None:
            return function
    if implementation in (None, EAGER):
        return eager_attention_forward
    if output_attentions:
        logger.warning_once(
            f"output_attentions=True: the MLA layers of calls that ask for attention maps run eager attention "
            f"(attn_implementation={implementation!r} forms no attention weights)"
        )
        return eager_attention_for_maps
    if implementation in FLASH_ATTENTION_BACKENDS:
        return flash_attention_forward
    return ALL_ATTENTION_FUNCTIONS[implementation]


def mla_attention_function(
    module: ZebraMLA,
    query: torch.Tensor,
    cached: bool,
    packed: bool,
    sp_context: SequenceParallelContext | None = None,
    cache_path: str = LATENT,
    output_attentions: bool = False,
) -> Callable:
    """The attention function of one call, chosen here only (see the module docstring): with earlier tokens
    in the cache (``cached``) the absorbed decode for a few queries, else one key head at a time (but on
    FlashAttention); otherwise, and for ``cache_path=EXPAND``, :func:`expanded_attention` on the kernel
    :func:`expanded_attention_kernel` picks (wrapped for Ulysses under sequence parallelism). Every function
    returned takes ``(module, query, latent, rope_entry, attention_mask, **kwargs)`` and returns the output
    and the attention weights ``[B, heads, q, keys]`` or ``None``.

    Where ``output_attentions`` gets its maps: the absorbed decode computes the exact softmax weights over the
    cached latents in every call, and returns them; every other path runs an eager kernel for a call that
    asks for them (:func:`expanded_attention_kernel`), on whatever ``attn_implementation`` was selected."""
    if cache_path not in CACHE_PATHS:
        raise ValueError(f"{CACHE_PATH_KEYWORD}={cache_path!r}: use one of {', '.join(CACHE_PATHS)}")
    latent_cache = cached and cache_path == LATENT
    if latent_cache and query.shape[2] <= mla_decode.ABSORBED_DECODE_MAX_QUERIES:
        return mla_decode.absorbed_attention
    kernel = expanded_attention_kernel(module, packed, query, output_attentions)
    if latent_cache and module.config._attn_implementation not in FLASH_ATTENTION_BACKENDS:
        return functools.partial(mla_decode.attention_by_key_head, kernel=kernel)
    if sp_context is not None:
        kernel = ulysses_attention(sp_context, kernel, module.config._attn_implementation)
    return functools.partial(expanded_attention, kernel=kernel)

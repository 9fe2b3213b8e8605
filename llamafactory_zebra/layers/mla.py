"""Multi-head Latent Attention as the released Zebra MLA layers lay it out.

Queries go through a low-rank pair (``q_a_proj`` → ``q_b_proj``, no norm in between); keys and values
come from one compressed latent (``kv_a_proj_with_mqa`` → ``kv_a_layernorm`` → ``kv_b_proj``) expanded
to ``num_key_value_heads`` heads that each serve ``num_attention_heads / num_key_value_heads`` query
heads. RoPE touches only the last ``qk_rope_head_dim`` dims of each q/k head, and the rope part of K
is one vector shared by every head. The decode cache keeps the latent and the rope key — not the
expanded K/V — which is the memory saving the architecture exists for.

Attention itself goes through transformers' attention interface, so ``eager``, ``sdpa`` and
``flash_attention_2`` (with its varlen path for packed sequences) all work unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..configuration_zebra import ZebraConfig
from .norms import ZebraRMSNorm


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, heads, T, D]`` by ``cos``/``sin`` ``[B, T, D]`` (Qwen3's half-split convention)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


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


def yarn_softmax_mscale(config: ZebraConfig) -> float:
    """DeepSeek's YaRN softmax correction: ``mscale(factor, mscale_all_dim)²`` when ``mscale_all_dim`` is set."""
    rope = config.rope_parameters
    mscale_all_dim = rope.get("mscale_all_dim") if rope.get("rope_type") == "yarn" else None
    if not mscale_all_dim:
        return 1.0
    factor = rope["factor"]
    mscale = 1.0 if factor <= 1 else 0.1 * mscale_all_dim * torch.log(torch.tensor(float(factor))).item() + 1.0
    return mscale * mscale


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
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        self.scaling = self.qk_head_dim**-0.5 * yarn_softmax_mscale(config)

        bias = config.attention_bias
        if config.q_lora_rank is None:
            self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.qk_head_dim, bias=bias)
        else:
            self.q_a_proj = nn.Linear(config.hidden_size, config.q_lora_rank, bias=bias)
            self.q_b_proj = nn.Linear(config.q_lora_rank, self.num_heads * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(config.hidden_size, self.kv_lora_rank + self.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = ZebraRMSNorm(self.kv_lora_rank, eps=config.rms_norm_eps)
        self.kv_b_proj = nn.Linear(
            self.kv_lora_rank, self.num_key_value_heads * (self.qk_nope_head_dim + self.v_head_dim), bias=False
        )
        self.out_proj = nn.Linear(self.num_heads * self.v_head_dim, config.hidden_size, bias=bias)

    def project_queries(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.config.q_lora_rank is None:
            return self.q_proj(hidden_states)
        return self.q_b_proj(self.q_a_proj(hidden_states))

    def compress(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-token cache entry: normalised latent ``[B, 1, T, r]`` and un-rotated rope key ``[B, 1, T, d]``."""
        compressed = self.kv_a_proj_with_mqa(hidden_states)
        latent, rope_key = compressed.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        return self.kv_a_layernorm(latent).unsqueeze(1), rope_key.unsqueeze(1)

    def expand(self, latent: torch.Tensor, rope_key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Latent ``[B, 1, S, r]`` and rotated rope key ``[B, 1, S, d]`` → keys and values ``[B, kv_heads, S, ·]``."""
        batch, _, length, _ = latent.shape
        kv = self.kv_b_proj(latent.squeeze(1)).view(
            batch, length, self.num_key_value_heads, self.qk_nope_head_dim + self.v_head_dim
        )
        key_nope, value = kv.transpose(1, 2).split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        key = torch.cat((key_nope, rope_key.expand(-1, self.num_key_value_heads, -1, -1)), dim=-1)
        return key, value

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> torch.Tensor:
        batch, length, _ = hidden_states.shape
        cos, sin = position_embeddings
        sp_context = kwargs.pop("sp_context", None)

        query = self.project_queries(hidden_states).view(batch, length, self.num_heads, self.qk_head_dim)
        query_nope, query_rope = query.transpose(1, 2).split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        query = torch.cat((query_nope, apply_rotary(query_rope, cos, sin)), dim=-1)

        latent, rope_key = self.compress(hidden_states)
        rope_key = apply_rotary(rope_key, cos, sin)
        if past_key_values is not None:
            latent, rope_key = past_key_values.update(latent, rope_key, self.layer_idx)
        key, value = self.expand(latent, rope_key)

        attention_interface: Callable = eager_attention_forward
        if self.config._attn_implementation not in (None, "eager"):
            attention_interface = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        if sp_context is not None:
            attention_interface = sp_context.attention(attention_interface, self.config._attn_implementation)
        output, _ = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        return self.out_proj(output.reshape(batch, length, -1))

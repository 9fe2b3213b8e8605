"""Zebra's MLA token mixer on vLLM's parts: the projections, norms and RoPE, then one of two cache layouts.

- **latent** (the default): the layer caches what the transformers model's decode cache holds, the
  latent, the rotated rope key and, for ``mla_norm: qk_head``, each key head's ``1 / rms``
  (``ZebraConfig.mla_cache_channels`` values per token), in the plugin's own cache layer
  (``latent_mla.py``): decode absorbed, prompts expanded from the cache one key block at a time.
- **expanded**: the latent is expanded by ``kv_b_proj`` into ``num_key_value_heads`` ordinary key/value
  heads in vLLM's paged ``Attention`` (GQA, any vLLM backend), as vLLM itself serves DeepSeek under
  ``VLLM_MLA_DISABLE=1``: ``2 × kv_heads × max(qk_head_dim, v_head_dim)`` values per token. Chosen by that
  same variable, and whenever LoRA is enabled (:func:`cache_layout` says why: the absorbed decode reads
  ``kv_b_proj``'s base weights, so an adapter on it would be left out).

vLLM's own MLA layer serves neither: its CPU kernels take a 576-wide latent only (Zebra: 320 or 328), its
absorption assumes an up-projection per query head, and none of its kernels applies a per-key-head scale.
Written here is only the wiring Zebra's layout needs and DeepSeek's vLLM attention lacks:

- ``mla_norm: qk_head`` — Qwen3's per-head RMSNorms on each query head and on each expanded key head
  ``[k_nope_h; k_pe]`` before RoPE (vLLM's ``RMSNorm`` over the head dim, as vLLM's Qwen3 applies it;
  in the latent layout the key norm's weights and ``1 / rms`` are applied where the keys are formed);
  ``lora`` — norms on the query and key/value latents; ``none`` — no norm;
- RoPE on the last ``qk_rope_head_dim`` dims only, interleaved pairs (``rope_interleave: true``, vLLM's
  GPT-J style) or half-split (Qwen3/NeoX style). The training code de-interleaves before rotating; that
  permutes q's and k's rope dims alike, so every score is the same;
- expanded layout: query/key and value heads of different sizes are zero-padded to the larger one (vLLM's
  CPU attention takes one head size; zeros change no score and the padded output columns are dropped).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn
from vllm import envs
from vllm.config import VllmConfig
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from vllm.model_executor.layers.rotary_embedding import get_rope

from ...configuration_zebra import MLA_NORM_LORA, MLA_NORM_QK_HEAD, ZebraConfig
from ...rope import mla_softmax_scale
from .arch_config import expanded_head_size
from .latent_mla import ZebraLatentCache

logger = logging.getLogger(__name__)
LATENT, EXPANDED = "latent", "expanded"


def cache_layout(vllm_config: VllmConfig) -> tuple[str, str]:
    """The MLA cache layout this engine serves and why (module docstring): latent unless
    ``VLLM_MLA_DISABLE=1`` (vLLM's own switch from latent MLA to expanded heads) or LoRA is enabled."""
    if envs.VLLM_MLA_DISABLE:
        return EXPANDED, "VLLM_MLA_DISABLE=1"
    if vllm_config.lora_config is not None:
        return EXPANDED, (
            "LoRA is enabled: the latent layout's absorbed decode reads kv_b_proj's base weights, so an "
            "adapter on kv_b_proj would be left out of decode steps"
        )
    return LATENT, "the default"


def cache_values_per_token(config: ZebraConfig, layout: str) -> int:
    """Values an MLA layer caches per token: the latent row, or expanded keys and values of ``kv_heads`` heads."""
    if layout == LATENT:
        return config.mla_cache_channels
    return 2 * config.num_key_value_heads * expanded_head_size(config)


def rotary_embedding(config: ZebraConfig):
    """vLLM's RoPE for the rope dims: default, linear or YaRN (its YaRN follows transformers' parameters)."""
    rope = dict(config.rope_parameters)
    rope.setdefault("rope_type", rope.pop("type", "default"))
    if rope["rope_type"] == "dynamic":
        raise ValueError(
            "ZebraConfig.rope_parameters: rope_type 'dynamic' is not served by the vLLM model "
            "(transformers rescales it per sequence length, vLLM's dynamic NTK does not); use default, linear or yarn"
        )
    max_position = config.max_position_embeddings
    if rope["rope_type"] == "yarn":
        max_position = rope["original_max_position_embeddings"]
    return get_rope(
        config.qk_rope_head_dim,
        max_position=max_position,
        is_neox_style=not config.rope_interleave,
        rope_parameters=rope,
        dtype=torch.float32,
    )


class ZebraMLAAttention(nn.Module):
    def __init__(self, config: ZebraConfig, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        quant_config = vllm_config.quant_config
        self.layout = cache_layout(vllm_config)[0]
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.nope = config.qk_nope_head_dim
        self.rope_dim = config.qk_rope_head_dim
        self.qk_head_dim = config.qk_head_dim
        self.v_head_dim = config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        self.q_lora_rank = config.q_lora_rank
        self.mla_norm = config.mla_norm
        bias, eps = config.attention_bias, config.rms_norm_eps

        if self.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(
                config.hidden_size,
                self.num_heads * self.qk_head_dim,
                bias=bias,
                quant_config=quant_config,
                prefix=f"{prefix}.q_proj",
            )
        else:
            self.q_a_proj = ReplicatedLinear(
                config.hidden_size, self.q_lora_rank, bias=bias, quant_config=quant_config, prefix=f"{prefix}.q_a_proj"
            )
            if self.mla_norm == MLA_NORM_LORA:
                self.q_a_layernorm = RMSNorm(self.q_lora_rank, eps=eps)
            self.q_b_proj = ColumnParallelLinear(
                self.q_lora_rank,
                self.num_heads * self.qk_head_dim,
                bias=False,
                quant_config=quant_config,
                prefix=f"{prefix}.q_b_proj",
            )
        self.kv_a_proj_with_mqa = ReplicatedLinear(
            config.hidden_size,
            self.kv_lora_rank + self.rope_dim,
            bias=bias,
            quant_config=quant_config,
            prefix=f"{prefix}.kv_a_proj_with_mqa",
        )
        if self.mla_norm == MLA_NORM_LORA:
            self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, eps=eps)
        self.kv_b_proj = ColumnParallelLinear(
            self.kv_lora_rank,
            self.num_kv_heads * (self.nope + self.v_head_dim),
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.kv_b_proj",
        )
        self.out_proj = RowParallelLinear(
            self.num_heads * self.v_head_dim,
            config.hidden_size,
            bias=bias,
            quant_config=quant_config,
            prefix=f"{prefix}.out_proj",
        )
        if self.mla_norm == MLA_NORM_QK_HEAD:
            self.q_norm = RMSNorm(self.qk_head_dim, eps=eps)
            self.k_norm = RMSNorm(self.qk_head_dim, eps=eps)
        self.rotary_emb = rotary_embedding(config)
        self.scales_offset = self.kv_lora_rank + self.rope_dim if self.mla_norm == MLA_NORM_QK_HEAD else None
        self.head_size = expanded_head_size(config)
        self.attn = self._attention(config, vllm_config, prefix)

    def _attention(self, config: ZebraConfig, vllm_config: VllmConfig, prefix: str) -> nn.Module:
        """The layer that caches and attends: the latent cache layer, or vLLM's paged ``Attention`` (expanded)."""
        scale = mla_softmax_scale(config)
        if self.layout == LATENT:
            return ZebraLatentCache(
                self, config.mla_cache_channels, scale, vllm_config.model_config.dtype, prefix=f"{prefix}.attn"
            )
        return Attention(
            self.num_heads,
            self.head_size,
            scale,
            num_kv_heads=self.num_kv_heads,
            cache_config=vllm_config.cache_config,
            quant_config=vllm_config.quant_config,
            prefix=f"{prefix}.attn",
        )

    def queries(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[T, heads, qk_head_dim]`` before RoPE."""
        if self.q_lora_rank is None:
            query, _ = self.q_proj(hidden_states)
        else:
            query, _ = self.q_a_proj(hidden_states)
            if self.mla_norm == MLA_NORM_LORA:
                query = self.q_a_layernorm(query)
            query, _ = self.q_b_proj(query)
        query = query.view(-1, self.num_heads, self.qk_head_dim)
        return self.q_norm(query) if self.mla_norm == MLA_NORM_QK_HEAD else query

    def compress(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The latent (normed for ``mla_norm: lora``) ``[T, R]`` and the rope key before RoPE ``[T, P]``."""
        compressed, _ = self.kv_a_proj_with_mqa(hidden_states)
        latent, rope_key = compressed.split([self.kv_lora_rank, self.rope_dim], dim=-1)
        if self.mla_norm == MLA_NORM_LORA:
            latent = self.kv_a_layernorm(latent.contiguous())
        return latent, rope_key

    def split_heads(self, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv_b_proj`` output ``[T, kv_heads · (nope + v)]`` → key nope ``[T, kv_heads, nope]`` and value
        ``[T, kv_heads, v]``."""
        return kv.view(-1, self.num_kv_heads, self.nope + self.v_head_dim).split([self.nope, self.v_head_dim], dim=-1)

    def keys_values(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Expanded keys ``[T, kv_heads, qk_head_dim]`` before RoPE and values ``[T, kv_heads, v_head_dim]``."""
        latent, rope_key = self.compress(hidden_states)
        kv, _ = self.kv_b_proj(latent)
        key_nope, value = self.split_heads(kv)
        rope_key = rope_key[:, None].expand(-1, self.num_kv_heads, -1)
        key = torch.cat((key_nope, rope_key), dim=-1)
        return (self.k_norm(key) if self.mla_norm == MLA_NORM_QK_HEAD else key), value

    def rotate(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE on the rope dims (the last ``P``) of ``query`` ``[T, H, ·]`` and ``key`` ``[T, heads, ·]``."""
        tokens = query.shape[0]
        query_rope, key_rope = self.rotary_emb(
            positions, query[..., self.nope :].reshape(tokens, -1), key[..., -self.rope_dim :].reshape(tokens, -1)
        )
        query = torch.cat((query[..., : self.nope], query_rope.view(tokens, self.num_heads, -1)), dim=-1)
        key = torch.cat((key[..., : -self.rope_dim], key_rope.view(tokens, key.shape[1], -1)), dim=-1)
        return query, key

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        query = self.queries(hidden_states)
        if self.layout == LATENT:
            output = self._latent_attention(positions, hidden_states, query)
        else:
            output = self._expanded_attention(positions, hidden_states, query)
        output, _ = self.out_proj(output.reshape(-1, self.num_heads * self.v_head_dim))
        return output

    def _expanded_attention(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, query: torch.Tensor
    ) -> torch.Tensor:
        key, value = self.keys_values(hidden_states)
        query, key = self.rotate(positions, query, key)
        query, key, value = (F.pad(x, [0, self.head_size - x.shape[-1]]) for x in (query, key, value))
        output = self.attn(query.flatten(1), key.flatten(1), value.flatten(1))
        return output.view(-1, self.num_heads, self.head_size)[..., : self.v_head_dim]

    def _latent_attention(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, query: torch.Tensor
    ) -> torch.Tensor:
        latent, rope_key = self.compress(hidden_states)
        rows = [latent, rope_key]
        if self.mla_norm == MLA_NORM_QK_HEAD:
            # 1 / rms of each key head [k_nope_h; k_pe] before its weights (the expanded layout's k_norm input),
            # then the rope key times the norm's rope weights, rotated below.
            kv, _ = self.kv_b_proj(latent)
            key_nope = self.split_heads(kv)[0].float()
            energy = key_nope.pow(2).sum(-1) + rope_key.float().pow(2).sum(-1, keepdim=True)
            rows.append(torch.rsqrt(energy / self.qk_head_dim + self.k_norm.variance_epsilon).to(latent.dtype))
            rows[1] = rope_key * self.k_norm.weight[self.nope :]
        query, rows[1] = self.rotate(positions, query, rows[1][:, None])
        rows[1] = rows[1][:, 0]
        output = query.new_zeros(query.shape[0], self.num_heads, self.v_head_dim)
        self.attn(query, torch.cat(rows, dim=-1), output)
        return output

    def _key_weights(self) -> torch.Tensor | None:
        return self.k_norm.weight if self.mla_norm == MLA_NORM_QK_HEAD else None

    def load_up_projection(self, dtype: torch.dtype) -> None:
        """Keep ``kv_b_proj``'s key ``[kv_heads, nope, R]`` and value ``[kv_heads, v, R]`` halves for the absorbed
        decode. Read by calling the module on the identity once its weights are in their runtime form (vLLM's
        CPU linear layers repack theirs after loading, so ``.weight`` is not the matrix any more)."""
        device = next(self.parameters()).device
        kv, _ = self.kv_b_proj(torch.eye(self.kv_lora_rank, dtype=dtype, device=device))
        key_nope, value = self.split_heads(kv)
        self.key_up = key_nope.permute(1, 2, 0).contiguous()
        self.value_up = value.permute(1, 2, 0).contiguous()

    def absorb(self, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated queries ``[T, H, Dqk]`` → latent-space queries ``[T, H, R]`` (the key norm's nope weights and
        ``W_UK`` folded in) and their rope parts ``[T, H, P]``: the scores are ``q_latent · c + q_rope · k_rope``."""
        tokens = query.shape[0]
        query_nope, query_rope = query[..., : self.nope], query[..., self.nope :]
        weights = self._key_weights()
        if weights is not None:
            query_nope = query_nope * weights[: self.nope]
        key_up = self.key_up
        grouped = query_nope.reshape(tokens, self.num_kv_heads, -1, self.nope)
        query_latent = torch.einsum("tkgn,knr->tkgr", grouped, key_up).reshape(tokens, self.num_heads, -1)
        return query_latent, query_rope

    def up_project(self, context: torch.Tensor) -> torch.Tensor:
        """Softmax-weighted latents ``[T, H, R]`` → the output ``[T, H, v]`` (each head's key head's ``W_UV``)."""
        tokens = context.shape[0]
        value_up = self.value_up.to(context.dtype)
        grouped = context.reshape(tokens, self.num_kv_heads, -1, self.kv_lora_rank)
        return torch.einsum("tkgr,kvr->tkgv", grouped, value_up).reshape(tokens, self.num_heads, -1)

    def expand(
        self, latent: torch.Tensor, rope: torch.Tensor, scales: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached rows' latents ``[S, R]``, rope keys ``[S, P]`` and scales ``[S, kv_heads]`` → the keys
        ``[S, kv_heads, Dqk]`` and values ``[S, kv_heads, v]`` the expanded layout would have cached."""
        kv, _ = self.kv_b_proj(latent)
        key_nope, value = self.split_heads(kv)
        rope = rope[:, None].to(key_nope.dtype).expand(-1, self.num_kv_heads, -1)
        if scales is not None:
            inverse_rms = scales[..., None].to(key_nope.dtype)
            key_nope = key_nope * inverse_rms * self.k_norm.weight[: self.nope]
            rope = rope * inverse_rms
        return torch.cat((key_nope, rope), dim=-1), value

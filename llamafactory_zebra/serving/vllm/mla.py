"""Zebra's MLA token mixer on vLLM's parts, computed as expanded keys/values in vLLM's paged ``Attention``.

vLLM's MLA layer caches the latent, but its CPU backends compile only a 576-wide latent (DeepSeek's;
Zebra's is 256 + 64 = 320), and on GPU its query/key path assumes DeepSeek's norm placement. So, as
vLLM itself does for DeepSeek under ``VLLM_MLA_DISABLE=1``, the latent is expanded by ``kv_b_proj`` into
``num_key_value_heads`` ordinary key/value heads and attention runs through vLLM's ``Attention`` (GQA,
paged cache, continuous batching). The cache then holds ``2 × kv_heads × qk_head_dim`` values per token
instead of the latent's 320 (``docs/benchmarks.md`` has both figures); a latent cache on GPU is not
implemented.

Everything is vLLM's (linear layers, ``RMSNorm``, ``get_rope``, ``Attention``); written here is only the
wiring Zebra's layout needs and DeepSeek's vLLM attention lacks:

- ``mla_norm: qk_head`` — Qwen3's per-head RMSNorms on each query head and on each expanded key head
  ``[k_nope_h; k_pe]`` before RoPE (vLLM's ``RMSNorm`` over the head dim, as vLLM's Qwen3 applies it);
  ``lora`` — norms on the query and key/value latents; ``none`` — no norm;
- RoPE on the last ``qk_rope_head_dim`` dims only, interleaved pairs (``rope_interleave: true``, vLLM's
  GPT-J style) or half-split (Qwen3/NeoX style). The training code de-interleaves before rotating; that
  permutes q's and k's rope dims alike, so every score is the same;
- query/key and value heads of different sizes are zero-padded to the larger one (vLLM's CPU attention
  takes one head size; zeros change no score and the padded output columns are dropped).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from vllm.config import CacheConfig
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from vllm.model_executor.layers.quantization import QuantizationConfig
from vllm.model_executor.layers.rotary_embedding import get_rope

from ...configuration_zebra import MLA_NORM_LORA, MLA_NORM_QK_HEAD, ZebraConfig
from ...rope import mla_softmax_scale


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
    def __init__(
        self,
        config: ZebraConfig,
        cache_config: CacheConfig | None,
        quant_config: QuantizationConfig | None,
        prefix: str,
    ) -> None:
        super().__init__()
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
        self.head_size = max(self.qk_head_dim, self.v_head_dim)
        self.attn = Attention(
            self.num_heads,
            self.head_size,
            mla_softmax_scale(config),
            num_kv_heads=self.num_kv_heads,
            cache_config=cache_config,
            quant_config=quant_config,
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

    def keys_values(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Expanded keys ``[T, kv_heads, qk_head_dim]`` before RoPE and values ``[T, kv_heads, v_head_dim]``."""
        compressed, _ = self.kv_a_proj_with_mqa(hidden_states)
        latent, rope_key = compressed.split([self.kv_lora_rank, self.rope_dim], dim=-1)
        if self.mla_norm == MLA_NORM_LORA:
            latent = self.kv_a_layernorm(latent.contiguous())
        kv, _ = self.kv_b_proj(latent)
        key_nope, value = kv.view(-1, self.num_kv_heads, self.nope + self.v_head_dim).split(
            [self.nope, self.v_head_dim], dim=-1
        )
        rope_key = rope_key[:, None].expand(-1, self.num_kv_heads, -1)
        key = torch.cat((key_nope, rope_key), dim=-1)
        return (self.k_norm(key) if self.mla_norm == MLA_NORM_QK_HEAD else key), value

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        query = self.queries(hidden_states)
        key, value = self.keys_values(hidden_states)
        tokens = hidden_states.shape[0]
        query_rope, key_rope = self.rotary_emb(
            positions, query[..., self.nope :].reshape(tokens, -1), key[..., self.nope :].reshape(tokens, -1)
        )
        query = torch.cat((query[..., : self.nope], query_rope.view(tokens, self.num_heads, -1)), dim=-1)
        key = torch.cat((key[..., : self.nope], key_rope.view(tokens, self.num_kv_heads, -1)), dim=-1)
        query, key, value = (F.pad(x, [0, self.head_size - x.shape[-1]]) for x in (query, key, value))
        output = self.attn(query.flatten(1), key.flatten(1), value.flatten(1))
        output = output.view(-1, self.num_heads, self.head_size)[..., : self.v_head_dim]
        output, _ = self.out_proj(output.reshape(-1, self.num_heads * self.v_head_dim))
        return output

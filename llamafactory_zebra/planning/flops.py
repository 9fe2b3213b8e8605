"""Forward FLOPs per token of a Zebra or of the dense Qwen3 it replaces, at a given context length.

The serving benchmarks judge measured speed ratios against the ratio of work; this module is that
count, for both model kinds, so every benchmark prints the same figure. A token costs:

- its matrix products: 2 FLOPs per matmul weight (every linear layer; the LM head only where logits
  are computed: a prompt's last token and every generated one, as vLLM does);
- attention over its context (MLA or dense layers): 2 x heads x (qk_head_dim + v_head_dim) x context,
  the QK^T scores and the PV product; a causal prompt of L tokens averages a context of (L + 1) / 2;
- GDN's chunked recurrence (prefill), per head with key K, value V and chunk C (fla's WY form, as
  ``ops/gated_delta_rule/chunk.py`` runs it): the in-chunk K K^T, Q K^T and W (2 C K each), U and the
  in-chunk output (2 C V each), the products of Q and W with the state (4 K V) and the state update
  (2 K V); a decode step (``fused_recurrent``) reads S^T k and S^T q and writes the state: 6 K V.

Element-wise work (norms, gates, convs, activations) is left out: a few FLOPs per channel, against
thousands per channel for the products.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..configuration_zebra import GDN, MLA, is_zebra_config
from ..ops.gated_delta_rule.chunk import CHUNK_SIZE


@dataclass(frozen=True)
class ModelFlopShape:
    """What the count needs to know of a model: its matmul weights and its token mixers' shapes."""

    layer_matmul_weights: int  # every linear layer of the decoder layers (mixers and MLPs)
    head_weights: int  # the LM head
    attention_layers: int
    attention_heads: int
    qk_head_dim: int
    v_head_dim: int
    gdn_layers: int = 0
    gdn_heads: int = 0
    gdn_key_dim: int = 0
    gdn_value_dim: int = 0

    def token(self, context: int, *, logits: bool, prefill: bool = True) -> float:
        """FLOPs of one token that attends to ``context`` tokens (itself included)."""
        flops = 2.0 * self.layer_matmul_weights + (2.0 * self.head_weights if logits else 0.0)
        flops += 2.0 * self.attention_layers * self.attention_heads * (self.qk_head_dim + self.v_head_dim) * context
        key, value = self.gdn_key_dim, self.gdn_value_dim
        per_head = 2 * CHUNK_SIZE * (3 * key + 2 * value) + 6 * key * value if prefill else 6 * key * value
        return flops + float(self.gdn_layers * self.gdn_heads * per_head)

    def request(self, prompt_tokens: int, output_tokens: int) -> float:
        """FLOPs of a request: its prompt's prefill (logits of the last token) and its decode steps."""
        prefill = sum(self.token(t, logits=t == prompt_tokens) for t in range(1, prompt_tokens + 1))
        decode = sum(
            self.token(prompt_tokens + t, logits=True, prefill=False) for t in range(1, max(output_tokens, 1))
        )
        return prefill + decode


def flop_shape(model: torch.nn.Module) -> ModelFlopShape:
    """The FLOP shape of a built transformers model: a ``ZebraForCausalLM`` or a dense causal LM (Qwen3)."""
    config = model.config
    decoder = model.get_decoder()
    layer_weights = sum(
        module.weight.numel() for module in decoder.layers.modules() if isinstance(module, torch.nn.Linear)
    )
    head = model.get_output_embeddings().weight.numel()
    if not is_zebra_config(config):
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return ModelFlopShape(
            layer_weights, head, config.num_hidden_layers, config.num_attention_heads, head_dim, head_dim
        )
    return ModelFlopShape(
        layer_weights,
        head,
        attention_layers=config.layer_types.count(MLA),
        attention_heads=config.num_attention_heads,
        qk_head_dim=config.qk_head_dim,
        v_head_dim=config.v_head_dim,
        gdn_layers=config.layer_types.count(GDN),
        gdn_heads=config.gdn_num_heads,
        gdn_key_dim=config.gdn_head_dim,
        gdn_value_dim=config.gdn_head_v_dim,
    )

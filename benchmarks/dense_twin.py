"""The dense Qwen3 config a benchmark compares a Zebra against (``bench_serve_online.py``, ``bench_longctx_dense.py``,
``profile_train_memory.py``): the Zebra's vocabulary, width, depth, attention heads, positions, RoPE and special
tokens, an untied head, and the given MLP width and head size (the callers pick the MLP width that matches the
Zebra's parameter count)."""

from __future__ import annotations


def qwen3_config(zebra, intermediate_size: int, head_dim: int):
    """A ``Qwen3Config`` twin of the Zebra config ``zebra`` with ``intermediate_size`` and ``head_dim``."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=zebra.vocab_size,
        hidden_size=zebra.hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=zebra.num_hidden_layers,
        num_attention_heads=zebra.num_attention_heads,
        num_key_value_heads=zebra.num_key_value_heads,
        head_dim=head_dim,
        max_position_embeddings=zebra.max_position_embeddings,
        rope_parameters=zebra.rope_parameters,
        tie_word_embeddings=False,
        eos_token_id=zebra.eos_token_id,
        pad_token_id=zebra.pad_token_id,
        bos_token_id=None,
    )

"""Tiny Qwen3 teachers and Zebra students of matching shape, for the distillation tests."""

import torch


def tiny_qwen3(vocab_size=1024, seed=0, **overrides):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    values = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    values.update(overrides)
    torch.manual_seed(seed)
    config = Qwen3Config(**values)
    config._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(config)


def zebra_student_like(teacher, seed=1, **overrides):
    """A tiny Zebra with the teacher's shapes; embeddings, lm_head, final norm, MLPs and norms copied."""
    from llamafactory_zebra import ZebraConfig, ZebraForCausalLM

    t = teacher.config
    values = dict(vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size)
    values.update(overrides)
    config = ZebraConfig.from_preset("tiny", **values)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    student = ZebraForCausalLM(config)
    with torch.no_grad():
        student.model.embed_tokens.weight.copy_(teacher.model.embed_tokens.weight)
        student.lm_head.weight.copy_(teacher.lm_head.weight)
        student.model.norm.weight.copy_(teacher.model.norm.weight)
        for mine, theirs in zip(student.model.layers, teacher.model.layers, strict=True):
            mine.mlp.load_state_dict(theirs.mlp.state_dict())
            mine.input_layernorm.load_state_dict(theirs.input_layernorm.state_dict())
            mine.post_attention_layernorm.load_state_dict(theirs.post_attention_layernorm.state_dict())
    return student

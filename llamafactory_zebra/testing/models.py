"""Small Zebra builders shared by the tests of both venvs (``tests/``, and ``tests_vllm/``, which has no
LLaMA-Factory): a tiny config and model, and a model written in AMD's released layout. Only torch and
safetensors."""

import json

import torch
from safetensors.torch import save_file


def tiny_config(**overrides):
    from llamafactory_zebra import ZebraConfig

    values = {"vocab_size": 97}
    values.update(overrides)
    return ZebraConfig.from_preset("tiny", **values)


def tiny_model(dtype=torch.float64, attn_implementation="eager", **overrides):
    from llamafactory_zebra import ZebraForCausalLM

    config = tiny_config(**overrides)
    config._attn_implementation = attn_implementation
    return ZebraForCausalLM(config).to(dtype).eval()


def write_released_layout(path, model, drop=None, extra=None, hybrid_overrides=None, base_overrides=None):
    """``model`` saved as AMD publishes: Qwen3's config.json, the plan in hybrid_config.json, safetensors."""
    cfg = model.config
    base = {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": 128,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": True,  # Qwen3's, kept by AMD for reference: the hybrid's head is untied
        "torch_dtype": "float32",
    }
    hybrid = {
        "mla_layers": cfg.mla_layers,
        "q_lora_rank": cfg.q_lora_rank,
        "kv_lora_rank": cfg.kv_lora_rank,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "gdn_num_heads": cfg.gdn_num_heads,
        "gdn_head_dim": cfg.gdn_head_dim,
        "linear_type": "gdn",
        "max_position_embeddings": 40960,
        "rope_scaling": {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 32768},
    }
    base.update(base_overrides or {})
    hybrid.update(hybrid_overrides or {})
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(base))
    (path / "hybrid_config.json").write_text(json.dumps(hybrid))
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != drop}
    if extra:
        state[extra] = torch.zeros(3)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})

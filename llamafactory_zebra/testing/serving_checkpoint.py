"""Random Zebras with the released head shapes that the serving benchmarks measure: the ~100M model of
``benchmarks/bench_serving.py``, ``bench_prefix_caching.py`` and the GPU check's vLLM row
(``tools/gpu_check_vllm.py``), and, with other ``overrides``, ``bench_serve_online.py``'s long-context model:
one builder, so each reads the same model. It needs only torch and this package (both venvs have them)."""

from __future__ import annotations

from pathlib import Path

MODEL_OVERRIDES = {
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 8,
    "layer_types": ["gdn", "mla", "gdn", "gdn", "gdn", "mla", "gdn", "gdn"],
    "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
}


def build_checkpoint(output: Path, dtype: str, overrides: dict | None = None) -> dict:
    """Write the model (seed 0, ``dtype``; ``overrides`` in place of ``MODEL_OVERRIDES``) and the offline test
    tokenizer to ``output``; return its parameter count."""
    import torch

    from llamafactory_zebra import ZebraConfig, ZebraForCausalLM
    from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # The 1.7B preset's head shapes, with everything else shrunk.
    config = ZebraConfig.from_preset(
        "qwen3-1.7b-7mla21gdn-8k",
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos,
        bos_token_id=None,
        **(MODEL_OVERRIDES if overrides is None else overrides),
    )
    torch.manual_seed(0)
    model = ZebraForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(output)
    tokenizer.save_pretrained(output)
    return {"parameters": sum(p.numel() for p in model.parameters())}

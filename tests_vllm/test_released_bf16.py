"""bf16 on AMD's released layout (Qwen3 config.json + hybrid_config.json, ``use_lora_layer_norm``, YaRN
×32): vLLM's log-prob error against the fp32 transformers model stays within a small multiple of bf16's
own noise — the same transformers model run in bf16 on the same tokens."""

import pytest
import torch

from llamafactory_zebra.modeling_zebra import ZebraForCausalLM
from llamafactory_zebra.testing.models import write_released_layout
from llamafactory_zebra.testing.vllm_parity import (
    check_within_bf16_noise,
    prompts,
    serve,
    start_engine,
    stop_engine,
    zebra_model,
)

pytestmark = pytest.mark.slow

LENGTHS = [1, 4, 19, 77, 200]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("zebra-released")
    # The RoPE that write_released_layout's files state (YaRN ×32 over 32K): the saved model must be the one described.
    yarn = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 32.0, "original_max_position_embeddings": 32768}
    model = zebra_model(seed=3, mla_norm="lora", rope_parameters=yarn, max_position_embeddings=32768 * 32)
    write_released_layout(path, model, hybrid_overrides={"use_lora_layer_norm": True})
    # The reference is what transformers reads back from the released directory.
    model = ZebraForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert model.config.mla_norm == "lora" and model.config.rope_parameters["factor"] == 32.0
    llm = start_engine(path, "bfloat16")
    try:
        served = serve(llm, prompts(LENGTHS, model.config.vocab_size, seed=4), 6)
    finally:
        stop_engine(llm)
    return model, served


def test_bf16_error_is_within_a_small_multiple_of_bf16_noise(run):
    print(check_within_bf16_noise(*run))

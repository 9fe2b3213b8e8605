"""bf16 on AMD's released layout (Qwen3 config.json + hybrid_config.json, ``use_lora_layer_norm``, YaRN
×32): vLLM's log-prob error against the fp32 transformers model stays within a small multiple of bf16's
own noise — the same transformers model run in bf16 on the same tokens."""

import pytest
import torch
from vllm_parity import (
    agreement,
    errors_between,
    prompts,
    reference_logprobs,
    serve,
    start_engine,
    stop_engine,
    zebra_model,
)
from zebra_helpers import write_released_layout

from llamafactory_zebra.modeling_zebra import ZebraForCausalLM

pytestmark = pytest.mark.slow

LENGTHS = [1, 4, 19, 77, 200]
NOISE_MULTIPLE = 3.0


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
    model, served_list = run
    vllm_errors, floor_errors, gaps = [], [], []
    for served in served_list:
        tokens = served.prompt + served.generated
        exact = reference_logprobs(model, tokens, torch.float32)
        result = agreement(served, exact)
        vllm_errors.append((result.mean, result.max))
        floor_errors.append(errors_between(exact, reference_logprobs(model, tokens, torch.bfloat16), tokens))
        gaps += result.greedy_gaps
    vllm_mean = sum(m for m, _ in vllm_errors) / len(vllm_errors)
    floor_mean = sum(m for m, _ in floor_errors) / len(floor_errors)
    vllm_max, floor_max = max(m for _, m in vllm_errors), max(m for _, m in floor_errors)
    print(f"bf16 |Δlogprob| vs fp32: vLLM mean {vllm_mean:.4f} max {vllm_max:.4f}; "
          f"transformers bf16 mean {floor_mean:.4f} max {floor_max:.4f}")  # fmt: skip
    assert floor_mean > 0
    assert vllm_mean <= NOISE_MULTIPLE * floor_mean
    assert vllm_max <= NOISE_MULTIPLE * floor_max
    # Greedy: each token is the reference's argmax, or within bf16's noise of it (a near-tie).
    assert max(gaps) <= 2 * floor_max, gaps

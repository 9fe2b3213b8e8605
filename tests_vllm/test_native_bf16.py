"""bf16 on a native checkpoint with Qwen3's per-head norms (``mla_norm: qk_head``) and half-split RoPE
(``rope_interleave: false``): within a small multiple of bf16's own noise (see ``check_within_bf16_noise``).
The 180-token prompt is prefilled in 64-token chunks while the shorter ones decode, so steps mix decodes with
prefill chunks that continue a state (on CPUs with bf16 dot products: vLLM's C++ conv on the slots)."""

import pytest

from llamafactory_zebra.testing.vllm_parity import (
    check_within_bf16_noise,
    prompts,
    serve,
    start_engine,
    stop_engine,
    zebra_model,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("zebra-qk-head-bf16")
    model = zebra_model(seed=5, mla_norm="qk_head", rope_interleave=False)
    model.save_pretrained(path)
    llm = start_engine(path, "bfloat16", max_num_batched_tokens=64)
    try:
        served = serve(llm, prompts([1, 6, 50, 180], model.config.vocab_size, seed=6), 6)
    finally:
        stop_engine(llm)
    return model, served


def test_bf16_error_is_within_a_small_multiple_of_bf16_noise(run):
    print(check_within_bf16_noise(*run))

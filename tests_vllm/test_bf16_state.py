"""A bf16 GDN state (``--mamba-ssm-cache-dtype bfloat16``, half the state bytes a decode step moves): served in bf16,
the model stays within a small multiple of bf16's own noise (``check_within_bf16_noise``), prompts prefilled in
64-token chunks that continue their states, decodes through the C++ step on the bf16 slots."""

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
    path = tmp_path_factory.mktemp("zebra-bf16-state")
    model = zebra_model(seed=7)
    model.save_pretrained(path)
    llm = start_engine(path, "bfloat16", max_num_batched_tokens=64, mamba_ssm_cache_dtype="bfloat16")
    try:
        served = serve(llm, prompts([2, 40, 150, 300], model.config.vocab_size, seed=8), 8)
    finally:
        stop_engine(llm)
    return model, served


def test_a_bf16_state_stays_within_a_small_multiple_of_bf16_noise(run):
    print(check_within_bf16_noise(*run))

"""fp32: vLLM serves the native checkpoint with the released head shapes exactly as the transformers model
computes it (``mla_norm: qk_head``, interleaved RoPE), alone and in a batch of mixed lengths."""

import pytest

from llamafactory_zebra.testing.vllm_parity import (
    agreement,
    prompts,
    reference_logprobs,
    serve,
    start_engine,
    stop_engine,
    zebra_model,
)

pytestmark = pytest.mark.slow

# 1 to 300 tokens; 300 > max_num_batched_tokens, so that prompt is prefilled in chunks that continue
# from its GDN and KV state while the other requests decode in the same steps.
LENGTHS = [1, 2, 3, 7, 16, 31, 64, 129, 257, 300]
NEW_TOKENS = 6
FP32_TOLERANCE = 1e-3  # measured: 1.3e-5


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("zebra-qk-head")
    model = zebra_model(seed=0, mla_norm="qk_head", rope_interleave=True)
    model.save_pretrained(path)
    prompt_list = prompts(LENGTHS, model.config.vocab_size)
    llm = start_engine(path, "float32", max_num_batched_tokens=128)
    try:
        batched = serve(llm, prompt_list, NEW_TOKENS)
        alone = [serve(llm, [p], NEW_TOKENS)[0] for p in prompt_list]
    finally:
        stop_engine(llm)
    return model, batched, alone


def test_fp32_logprobs_and_greedy_tokens_equal_the_transformers_model(run):
    model, batched, _ = run
    worst = 0.0
    for served in batched:
        result = agreement(served, reference_logprobs(model, served.prompt + served.generated, model.dtype))
        assert result.max < FP32_TOLERANCE, (len(served.prompt), result)
        assert max(result.greedy_gaps) < FP32_TOLERANCE, (len(served.prompt), result.greedy_gaps)
        worst = max(worst, result.max)
    print(f"fp32 qk_head: max |Δlogprob| {worst:.2e}")


def test_a_batch_of_mixed_lengths_equals_each_prompt_alone(run):
    _, batched, alone = run
    for together, single in zip(batched, alone, strict=True):
        assert together.generated == single.generated, len(single.prompt)
        assert max(abs(a - b) for a, b in zip(together.logprobs, single.logprobs, strict=True)) < 1e-4

"""fp32: vLLM serves the native checkpoint with the released head shapes exactly as the transformers model
computes it (``mla_norm: qk_head``, interleaved RoPE), alone and in a batch of mixed lengths — under each of vLLM's
model runners (V1, Model Runner V2: ``VLLM_USE_V2_MODEL_RUNNER``) that can start here. Whether one can is asked of
vLLM (``runner_refusal``); one that cannot is skipped with vLLM's own reason, and that reason must be the known,
environmental one (no Triton backend for this device: docs/serving.md, "Model runners"), never the plugin's model."""

import pytest

from llamafactory_zebra.testing.vllm_parity import (
    RUNNER_ENV_VAR,
    RUNNERS,
    agreement,
    prompts,
    reference_logprobs,
    runner_refusal,
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


# vLLM 0.32's refusal of Model Runner V2 where Triton has no backend for the device (config/vllm.py).
V2_NEEDS_TRITON = "Model Runner V2 requires Triton."


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("zebra-qk-head")
    model = zebra_model(seed=0, mla_norm="qk_head", rope_interleave=True)
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="module")
def refusals(checkpoint):
    """Each runner's refusal by vLLM for this checkpoint (None: it builds an engine configuration)."""
    return {runner: runner_refusal(checkpoint[1], runner) for runner in RUNNERS}


@pytest.fixture(scope="module", params=list(RUNNERS))
def run(request, checkpoint, refusals):
    runner = request.param
    if refusals[runner] is not None:
        pytest.skip(f"vLLM's {runner} model runner cannot start here: {refusals[runner]}")
    model, path = checkpoint
    prompt_list = prompts(LENGTHS, model.config.vocab_size)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(RUNNER_ENV_VAR, RUNNERS[runner])
        llm = start_engine(path, "float32", max_num_batched_tokens=128)
    try:
        batched = serve(llm, prompt_list, NEW_TOKENS)
        alone = [serve(llm, [p], NEW_TOKENS)[0] for p in prompt_list]
    finally:
        stop_engine(llm)
    return model, batched, alone


def test_v1_starts_and_v2_is_refused_only_for_want_of_triton(refusals):
    """V1 always starts; V2 either starts (and ``run`` checks it as V1) or vLLM refuses it for the known reason
    that has nothing to do with the model (its Triton kernels have no backend here)."""
    from vllm.triton_utils import HAS_TRITON

    assert refusals["V1"] is None, refusals["V1"]
    if refusals["V2"] is not None:
        assert V2_NEEDS_TRITON in refusals["V2"] and not HAS_TRITON, refusals["V2"]


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

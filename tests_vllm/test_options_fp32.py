"""fp32, the other ZebraConfig options at once: ``mla_norm: none``, half-split RoPE (``rope_interleave:
false``), DeepSeek-style YaRN (``mscale``/``mscale_all_dim``), no query low-rank, tied embeddings,
attention biases (``tie_word_embeddings`` set: the transformers model keeps its head untied and saves
it, and vLLM must serve that head), a non-default ``gdn_norm_eps``, and a value head narrower than the q/k head."""

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

LENGTHS = [1, 9, 100, 260]
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 256,
    "mscale": 1.0,
    "mscale_all_dim": 0.8,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("zebra-options")
    model = zebra_model(
        seed=1,
        mla_norm="none",
        rope_interleave=False,
        rope_parameters=YARN,
        q_lora_rank=None,
        tie_word_embeddings=True,
        attention_bias=True,
        gdn_norm_eps=1e-2,
        v_head_dim=96,
    )
    model.save_pretrained(path)
    llm = start_engine(path, "float32")
    try:
        served = serve(llm, prompts(LENGTHS, model.config.vocab_size, seed=2), 5)
    finally:
        stop_engine(llm)
    return model, served


def test_every_option_is_served_exactly(run):
    model, served_list = run
    worst = 0.0
    for served in served_list:
        result = agreement(served, reference_logprobs(model, served.prompt + served.generated, model.dtype))
        assert result.max < 1e-3, (len(served.prompt), result)
        assert max(result.greedy_gaps) < 1e-3, (len(served.prompt), result.greedy_gaps)
        worst = max(worst, result.max)
    print(f"fp32 options: max |Δlogprob| {worst:.2e}")

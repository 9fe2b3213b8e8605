"""The latent MLA cache (``serving/vllm/latent_mla.py``), vLLM's default layout for Zebra, against the transformers
model, and the block arithmetic of both layouts read from the engine's own ``KVCacheConfig``.

fp32 parity for each ``mla_norm`` (unseen weights, GDN-first and MLA-first plans, ``q_lora_rank`` set and unset),
prompts up to three times ``max_num_batched_tokens`` (chunked prefill reading the cached latent of earlier
chunks), a batch equal to each prompt alone; requests preempted for want of blocks and recomputed give the same
tokens; the expanded layout (``VLLM_MLA_DISABLE=1``) stays exact. Prefix hits on the latent cache:
``test_prefix_caching.py`` (it serves the default layout)."""

import os

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
# collective_rpc sends a function to the worker (reading its KVCacheConfig), as test_prefix_caching.py does.
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

CHUNK = 128
LENGTHS = [1, 5, 130, 3 * CHUNK + 17]
NEW_TOKENS = 5
FP32_TOLERANCE = 1e-3  # the parity tolerance of test_parity_fp32.py
# vLLM's CPU platform aligns hybrid blocks to 128 tokens.
BLOCK_ALIGNMENT = 128
VARIANTS = {
    "qk_head": {"mla_norm": "qk_head", "rope_interleave": True},
    "lora_mla_first": {"mla_norm": "lora", "layer_types": ["mla", "gdn", "gdn", "mla"], "q_lora_rank": None},
    "none": {"mla_norm": "none", "rope_interleave": False, "attention_bias": True},
}


def _cache_groups(worker) -> list[dict]:
    """Run in vLLM's worker: each KV cache group's spec, as numbers."""
    groups = []
    for group in worker.model_runner.kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        groups.append(
            {
                "kind": type(spec).__name__,
                "layers": len(group.layer_names),
                "block": spec.block_size,
                "page": spec.page_size_bytes,
                "real_page": spec.real_page_size_bytes,
                "head_size": getattr(spec, "head_size", None),
                "head_size_v": getattr(spec, "head_size_v", None),
                "heads": getattr(spec, "num_kv_heads", None),
            }
        )
    return groups


def _served(tmp_path_factory, name: str, overrides: dict, seed: int, **engine_options):
    path = tmp_path_factory.mktemp(f"zebra-latent-{name}")
    model = zebra_model(seed=seed, **overrides)
    model.save_pretrained(path)
    prompt_list = prompts(LENGTHS, model.config.vocab_size, seed=seed)
    llm = start_engine(path, "float32", max_num_batched_tokens=CHUNK, **engine_options)
    try:
        (groups,) = llm.collective_rpc(_cache_groups)
        batched = serve(llm, prompt_list, NEW_TOKENS)
        alone = [serve(llm, [p], NEW_TOKENS)[0] for p in prompt_list]
    finally:
        stop_engine(llm)
    return model, groups, batched, alone


@pytest.fixture(scope="module", params=list(VARIANTS))
def latent(request, tmp_path_factory):
    return _served(
        tmp_path_factory, request.param, VARIANTS[request.param], seed=40 + list(VARIANTS).index(request.param)
    )


@pytest.fixture(scope="module")
def expanded(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_MLA_DISABLE", "1")
        return _served(tmp_path_factory, "expanded", VARIANTS["qk_head"], seed=50)


def check_parity(model, batched, alone) -> float:
    worst = 0.0
    for served, single in zip(batched, alone, strict=True):
        result = agreement(served, reference_logprobs(model, served.prompt + served.generated, model.dtype))
        assert result.max < FP32_TOLERANCE, (len(served.prompt), result)
        assert max(result.greedy_gaps) < FP32_TOLERANCE, (len(served.prompt), result.greedy_gaps)
        assert served.generated == single.generated, len(served.prompt)
        assert max(abs(a - b) for a, b in zip(served.logprobs, single.logprobs, strict=True)) < 1e-4
        worst = max(worst, result.max)
    return worst


def check_block_arithmetic(groups: list[dict], attention_bytes_per_token: int) -> None:
    """Every group has one page size; the attention page holds exactly ``block`` tokens of the bytes the MLA layer
    stores; the block is the smallest aligned one whose page covers a GDN state (so the GDN padding is less than one
    alignment step of attention tokens)."""
    attention = [g for g in groups if g["kind"] != "MambaSpec"]
    states = [g for g in groups if g["kind"] == "MambaSpec"]
    assert attention and states, groups
    assert len({g["page"] for g in groups}) == 1, groups
    for group in attention:
        assert group["real_page"] == group["block"] * attention_bytes_per_token, group
    state, block = states[0]["real_page"], attention[0]["block"]
    assert block % BLOCK_ALIGNMENT == 0 and block * attention_bytes_per_token >= state, (block, state)
    assert (block - BLOCK_ALIGNMENT) * attention_bytes_per_token < state, (block, state)


def test_latent_layout_caches_the_latent_row(latent):
    model, groups, _, _ = latent
    (mla,) = [g for g in groups if g["kind"] != "MambaSpec"]
    assert (mla["heads"], mla["head_size"], mla["head_size_v"]) == (1, model.config.mla_cache_channels, 0), mla
    check_block_arithmetic(groups, model.config.mla_cache_channels * 4)


def test_latent_layout_equals_the_transformers_model(latent):
    model, _, batched, alone = latent
    worst = check_parity(model, batched, alone)
    print(f"latent {model.config.mla_norm}: max |Δlogprob| {worst:.2e}")


def test_expanded_layout_counts_its_real_bytes_and_stays_exact(expanded):
    model, groups, batched, alone = expanded
    config = model.config
    (mla,) = [g for g in groups if g["kind"] != "MambaSpec"]
    head = max(config.qk_head_dim, config.v_head_dim)
    assert (mla["heads"], mla["head_size"]) == (config.num_key_value_heads, head), mla
    check_block_arithmetic(groups, 2 * config.num_key_value_heads * head * 4)
    check_parity(model, batched, alone)


def test_preempted_requests_are_recomputed_to_the_same_tokens(tmp_path_factory):
    """A cache with blocks for two requests and one spare: four prompts of almost a block each decode across the
    block border, so vLLM preempts some and recomputes them later from the latent cache."""
    path = tmp_path_factory.mktemp("zebra-latent-preempt")
    model = zebra_model(seed=61, max_position_embeddings=2048)
    model.save_pretrained(path)
    llm = start_engine(path, "float32", max_model_len=2048, max_num_batched_tokens=1024, max_num_seqs=4)
    try:
        (groups,) = llm.collective_rpc(_cache_groups)
    finally:
        stop_engine(llm)
    block = groups[0]["block"]
    # A request holds one latent block and two state blocks per GDN group (vLLM's align mode) until it crosses
    # the border.
    per_request = 1 + 2 * sum(g["kind"] == "MambaSpec" for g in groups)
    prompt_list = prompts([block - 3] * 4, model.config.vocab_size, seed=62)
    llm = start_engine(
        path,
        "float32",
        max_model_len=2048,
        max_num_batched_tokens=1024,
        max_num_seqs=4,
        num_gpu_blocks_override=2 * per_request + 1,
        disable_log_stats=False,  # the preemption counter
    )
    try:
        together = serve(llm, prompt_list, 8)
        preemptions = sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
        alone = [serve(llm, [p], 8)[0] for p in prompt_list]
    finally:
        stop_engine(llm)
    assert preemptions > 0
    for served, single in zip(together, alone, strict=True):
        assert served.generated == single.generated
        result = agreement(served, reference_logprobs(model, served.prompt + served.generated, model.dtype))
        assert result.max < FP32_TOLERANCE, result


def test_lora_and_vllm_mla_disable_serve_the_expanded_layout(monkeypatch):
    """The layout rule (``mla.cache_layout``): latent by default, expanded under ``VLLM_MLA_DISABLE=1`` or with
    LoRA enabled, each with its reason (the start-up log's words)."""
    from types import SimpleNamespace

    from llamafactory_zebra.serving.vllm.mla import EXPANDED, LATENT, cache_layout

    monkeypatch.delenv("VLLM_MLA_DISABLE", raising=False)
    assert cache_layout(SimpleNamespace(lora_config=None)) == (LATENT, "the default")
    layout, why = cache_layout(SimpleNamespace(lora_config=object()))
    assert layout == EXPANDED and "kv_b_proj" in why
    monkeypatch.setenv("VLLM_MLA_DISABLE", "1")
    assert cache_layout(SimpleNamespace(lora_config=None)) == (EXPANDED, "VLLM_MLA_DISABLE=1")

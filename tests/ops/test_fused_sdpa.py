"""MLA's unpacked sdpa calls on a CPU (``ops/fused_sdpa.py``) against plain eager attention, and the kernel they run.

The reference is ``layers.mla.eager_attention_forward`` (explicit scores, softmax, weighted values) in fp64 and
fp32, on the shapes and masks the model hands its attention function: a causal prompt with no mask, odd
lengths, left padding (a boolean 4-D mask), a chunk of queries over a longer cache, a decode step, grouped
key/value heads, q/k heads wider or narrower than v. That the fused kernel runs is checked by allowing only
PyTorch's flash backend: it raises "no available kernel" for anything it does not take, as it does for
transformers' own sdpa function on MLA's heads (which therefore ran the quadratic math kernel).
"""

from types import SimpleNamespace

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from llamafactory_zebra import ZebraConfig, ZebraForCausalLM
from llamafactory_zebra.layers.mla import eager_attention_forward, expanded_attention_kernel
from llamafactory_zebra.ops.fused_sdpa import fused_kernel_operands, fused_sdpa_attention

SCALE = 0.21


def _module(groups: int) -> SimpleNamespace:
    return SimpleNamespace(num_key_value_groups=groups, training=False, is_causal=True)


def _qkv(batch, heads, kv_heads, queries, keys, qk, v, dtype):
    generator = torch.Generator().manual_seed(queries * 31 + keys)
    shapes = ((batch, heads, queries, qk), (batch, kv_heads, keys, qk), (batch, kv_heads, keys, v))
    return [torch.randn(*shape, dtype=torch.float64, generator=generator).to(dtype) for shape in shapes]


def _causal(batch, queries, keys, padding=()):
    """Boolean ``[B, 1, q, k]``: bottom-right causal, row ``b``'s first ``padding[b]`` keys hidden."""
    mask = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries).expand(batch, 1, -1, -1).clone()
    for row, pad in enumerate(padding):
        mask[row, :, :, :pad] = False
        mask[row, :, :pad, :pad] = torch.eye(pad, dtype=torch.bool)  # padded queries see themselves, as sdpa_mask
    return mask


CASES = {
    # name: (batch, heads, kv_heads, queries, keys, qk, v, mask builder or None)
    "prompt-no-mask": (1, 4, 2, 37, 37, 64, 32, None),
    "prompt-values-wider": (1, 4, 4, 29, 29, 16, 40, None),
    "left-padding": (2, 4, 2, 23, 23, 64, 32, lambda: _causal(2, 23, 23, padding=(0, 5))),
    "chunk-over-cache": (1, 4, 2, 9, 61, 64, 32, lambda: _causal(1, 9, 61)),
    "decode-step": (2, 4, 1, 1, 45, 48, 32, None),
}


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 2e-6)], ids=["fp64", "fp32"])
@pytest.mark.parametrize("case", list(CASES))
def test_fused_sdpa_equals_eager_attention(case, dtype, tolerance):
    batch, heads, kv_heads, queries, keys, qk, v, make_mask = CASES[case]
    query, key, value = _qkv(batch, heads, kv_heads, queries, keys, qk, v, dtype)
    mask = make_mask() if make_mask else None
    module = _module(heads // kv_heads)
    reference_mask = mask
    if mask is None and queries > 1:  # no mask on a prompt means causal (transformers' contract)
        reference_mask = _causal(batch, queries, keys)
    want, _ = eager_attention_forward(module, query, key, value, reference_mask, scaling=SCALE)
    got, weights = fused_sdpa_attention(module, query, key, value, mask, scaling=SCALE)
    assert weights is None
    assert got.shape == (batch, queries, heads, v)
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.filterwarnings("ignore:Flash attention")  # what transformers' call says before it raises
@pytest.mark.parametrize("case", ["prompt-no-mask", "left-padding", "chunk-over-cache"])
def test_fused_sdpa_runs_the_flash_kernel_where_transformers_sdpa_cannot(case):
    batch, heads, kv_heads, queries, keys, qk, v, make_mask = CASES[case]
    query, key, value = _qkv(batch, heads, kv_heads, queries, keys, qk, v, torch.float32)
    mask = make_mask() if make_mask else None
    module = _module(heads // kv_heads)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        fused_sdpa_attention(module, query, key, value, mask, scaling=SCALE)
        with pytest.raises(RuntimeError, match="No available kernel"):
            sdpa_attention_forward(module, query, key, value, mask, scaling=SCALE)


def test_operands_repeat_key_heads_in_repeat_kv_order_and_pad_with_zeros():
    query, key, value = _qkv(1, 6, 2, 3, 3, 8, 5, torch.float64)
    q, k, val, value_dim = fused_kernel_operands(query, key, value)
    assert value_dim == 5 and q.shape[-1] == k.shape[-1] == val.shape[-1] == 8
    torch.testing.assert_close(k[:, :3, :, :8], key[:, :1].expand(-1, 3, -1, -1))
    torch.testing.assert_close(val[:, 3:, :, :5], value[:, 1:].expand(-1, 3, -1, -1))
    assert not val[..., 5:].any() and torch.equal(q, query)


def _long_context_model(attn_implementation: str) -> ZebraForCausalLM:
    config = ZebraConfig.from_preset("tiny-16k", vocab_size=97, pad_token_id=0, eos_token_id=None)
    config._attn_implementation = attn_implementation
    torch.manual_seed(3)
    return ZebraForCausalLM(config).eval()


def test_sdpa_model_on_cpu_picks_the_fused_function():
    model = _long_context_model("sdpa")
    layer = next(layer.mla for layer in model.model.layers if layer.layer_type == "mla")
    assert expanded_attention_kernel(layer, packed=False, query=torch.zeros(1)) is fused_sdpa_attention


def test_sdpa_generate_equals_eager_on_an_odd_length_prompt_without_the_math_kernel():
    """A whole prompt (odd length) and a greedy continuation, one-shot and in chunks: sdpa's logits and tokens
    are eager's, and the sdpa model's MLA never needs anything but the flash kernel."""
    eager, sdpa = _long_context_model("eager"), _long_context_model("sdpa")
    sdpa.load_state_dict(eager.state_dict())
    ids = torch.randint(1, 97, (1, 301), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = eager(ids).logits
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            got = sdpa(ids).logits
            got_tokens = sdpa.generate(ids, max_new_tokens=6, do_sample=False)
            # Chunked prefill (eval-long's): chunks after the first read the cache one key head at a time.
            chunked_tokens = sdpa.generate(ids, max_new_tokens=6, do_sample=False, prefill_chunk_size=128)
        want_tokens = eager.generate(ids, max_new_tokens=6, do_sample=False)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got_tokens, want_tokens) and torch.equal(chunked_tokens, want_tokens)

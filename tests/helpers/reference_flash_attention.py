"""A FlashAttention-2 stand-in for CPU tests: transformers' ``flash_attention_2`` path with a reference kernel.

transformers' ``flash_attention_2`` integration loads ``flash_attn_varlen_func`` lazily
(``modeling_flash_attention_utils._lazy_imports``). The ``reference_fa2`` fixture makes that loader
return a reference function with FlashAttention-2's signature that enforces FA2's input contract
(fp16/bf16, one head size for q, k and v, int32 ``cu_seqlens`` from 0 to the token count,
``max_seqlen`` covering every segment, whole groups of query heads per key head) and computes explicit
causal attention segment by segment, recording the borders it was given.
"""

import pytest
import torch
from transformers import modeling_flash_attention_utils as fa_utils


class ReferenceFlashAttention:
    """``flash_attn_func`` / ``flash_attn_varlen_func`` (flash-attn 2.x signatures) in plain PyTorch."""

    def __init__(self):
        self.varlen_calls, self.dense_calls = [], 0

    def flash_attn_func(
        self,
        q,
        k,
        v,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        return_attn_probs=False,
    ):
        """Per row, no borders: the path transformers takes when it sees no packing."""
        self.dense_calls += 1
        batch, length = q.shape[:2]
        cu = torch.arange(0, (batch + 1) * length, length, dtype=torch.int32)
        out = self.flash_attn_varlen_func(
            q.flatten(0, 1),
            k.flatten(0, 1),
            v.flatten(0, 1),
            cu,
            cu,
            length,
            length,
            dropout_p,
            softmax_scale,
            causal,
            window_size,
            softcap,
            alibi_slopes,
            deterministic,
            return_attn_probs,
            record=False,
        )
        return out.view(batch, length, *out.shape[1:])

    def flash_attn_varlen_func(
        self,
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        return_attn_probs=False,
        block_table=None,
        record=True,
    ):
        total, heads, head_dim = q.shape
        assert q.dtype in (torch.float16, torch.bfloat16) and k.dtype == v.dtype == q.dtype, q.dtype
        assert k.shape == v.shape and k.shape[-1] == head_dim, "FA2 needs one head size for q, k and v"
        assert heads % k.shape[1] == 0, "query heads must be whole groups per key head"
        for cu, max_len, tokens in ((cu_seqlens_q, max_seqlen_q, total), (cu_seqlens_k, max_seqlen_k, k.shape[0])):
            assert cu.dtype == torch.int32 and cu.dim() == 1, cu.dtype
            assert int(cu[0]) == 0 and int(cu[-1]) == tokens and bool((cu.diff() >= 0).all()), cu
            assert int(max_len) >= int(cu.diff().max()), (max_len, cu)
        assert torch.equal(cu_seqlens_q, cu_seqlens_k) and causal and dropout_p == 0.0
        assert window_size in ((-1, -1), [-1, -1]) and not softcap and alibi_slopes is None and block_table is None
        if record:
            self.varlen_calls.append(cu_seqlens_q.tolist())
        scale = head_dim**-0.5 if softmax_scale is None else softmax_scale
        groups = heads // k.shape[1]
        outputs = []
        for start, end in zip(cu_seqlens_q[:-1].tolist(), cu_seqlens_q[1:].tolist(), strict=True):
            qs, ks, vs = (x[start:end].float().transpose(0, 1) for x in (q, k, v))
            ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
            scores = qs @ ks.transpose(1, 2) * scale
            future = torch.ones(end - start, end - start, dtype=torch.bool).triu(1)
            weights = scores.masked_fill(future, float("-inf")).softmax(-1)
            outputs.append((weights @ vs).transpose(0, 1))
        return torch.cat(outputs).to(q.dtype)


@pytest.fixture
def reference_fa2(monkeypatch):
    reference = ReferenceFlashAttention()

    def lazy_imports(implementation, attention_wrapper=None, allow_all_kernels=False):
        assert implementation == "flash_attention_2", implementation
        return (
            reference.flash_attn_func,
            reference.flash_attn_varlen_func,
            None,
            fa_utils._pad_input,
            fa_utils._unpad_input,
        )

    monkeypatch.setattr(fa_utils, "_lazy_imports", lazy_imports)
    monkeypatch.setattr(fa_utils, "_loaded_implementation", None)
    return reference

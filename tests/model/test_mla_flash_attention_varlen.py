"""What the packed MLA path hands FlashAttention-2, checked on CPU against the sdpa path.

The ``reference_fa2`` fixture (``reference_flash_attention.py``) puts a reference kernel behind
transformers' ``flash_attention_2`` path. The model's public forward with
``attn_implementation="flash_attention_2"`` must then equal the sdpa model (logits and gradients, bf16
tolerance) on packed rows, whatever the batch size.
"""

import copy
import inspect

import pytest
import torch

from llamafactory_zebra.testing.models import tiny_model

# Both models run in bf16 (FA2 takes nothing else); errors are relative to the reference's largest
# logit, and for gradients to the norm of the gradient: per parameter for the attention layer, over all
# parameters together elsewhere (tiny GDN decay gradients are bf16 sums that cancel to noise).
BF16_TOLERANCE = 2e-2
BF16_GRAD_TOLERANCE = 5e-2


def test_reference_has_flash_attn_2_signature(reference_fa2):
    # transformers decides which keywords to send from this signature (``_lazy_define_process_function``).
    names = list(inspect.signature(reference_fa2.flash_attn_varlen_func).parameters)[:16]
    assert names[:7] == ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"]
    assert {"dropout_p", "softmax_scale", "causal", "window_size", "softcap", "deterministic"} <= set(names)


def packed_batch(lengths_per_row, vocab=97, seed=0):
    """Rows of packed samples (LLaMA-Factory ``packing``: positions restart), labels over real tokens."""
    gen = torch.Generator().manual_seed(seed)
    length = sum(lengths_per_row[0])
    input_ids = torch.randint(0, vocab, (len(lengths_per_row), length), generator=gen)
    position_ids = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in lengths_per_row])
    return input_ids, position_ids


def run(model, input_ids, position_ids):
    model.zero_grad()
    logits = model(input_ids=input_ids, position_ids=position_ids).logits
    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(1)).to(logits.dtype)
    (logits.float() * weights.float()).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


def relative(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def relative_norm(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize(
    "rows",
    [[[13, 1, 25, 6]], [[20, 25], [1, 30, 14]]],
    ids=["one-row", "two-rows"],
)
def test_packed_flash_attention_2_equals_sdpa(reference_fa2, rows):
    sdpa = tiny_model(
        dtype=torch.bfloat16, attn_implementation="sdpa", num_hidden_layers=2, layer_types=["gdn", "mla"]
    ).train()
    flash = copy.deepcopy(sdpa)
    flash.config._attn_implementation = "flash_attention_2"
    input_ids, position_ids = packed_batch(rows)

    logits_ref, grads_ref = run(sdpa, input_ids, position_ids)
    logits, grads = run(flash, input_ids, position_ids)

    borders = [0]
    for row in rows:
        for n in row:
            borders.append(borders[-1] + n)
    assert reference_fa2.dense_calls == 0, "packed rows reached flash_attn_func: samples would see each other"
    assert reference_fa2.varlen_calls == [borders] * len(reference_fa2.varlen_calls) != []
    assert relative(logits, logits_ref) < BF16_TOLERANCE
    assert grads.keys() == grads_ref.keys()
    for name, grad in grads.items():
        if ".mla." in name:
            assert relative_norm(grad, grads_ref[name]) < BF16_GRAD_TOLERANCE, name
    flat, flat_ref = (torch.cat([g[name].flatten() for name in sorted(g)]) for g in (grads, grads_ref))
    assert relative_norm(flat, flat_ref) < BF16_GRAD_TOLERANCE
    # The comparison can fail: the same rows read as single samples change the logits far beyond it.
    unpacked, _ = run(sdpa, input_ids, torch.arange(input_ids.shape[1]).expand_as(input_ids))
    assert relative(unpacked, logits_ref) > 10 * BF16_TOLERANCE


def test_sequence_parallel_flash_attention_2_keeps_rows_and_samples_apart(reference_fa2, monkeypatch):
    """Ulysses attention hands FA2 the whole rows' borders, also with two rows per micro-batch.

    One rank (the all-to-all of a group of one is the identity), so the core attention sees the whole
    rows; the reference is explicit causal attention within each sample.
    """
    from types import SimpleNamespace

    from llamafactory_zebra.layers.flash_attention import flash_attention_forward
    from llamafactory_zebra.packing import block_causal_mask
    from llamafactory_zebra.parallel import SequenceParallelLayout, build_sequence_parallel_context
    from llamafactory_zebra.parallel import attention as ulysses

    monkeypatch.setattr(ulysses, "all_to_all", lambda tensor, **_: tensor)
    segments = torch.tensor([[1, 1, 1, 2, 2, 0, 0], [1, 1, 1, 1, 2, 2, 3]])
    one_rank = SequenceParallelLayout(group=None, rank=0, size=1, dp_rank=0, dp_size=1)
    context = build_sequence_parallel_context(one_rank, segments)
    attend = ulysses.ulysses_attention(context, flash_attention_forward, "flash_attention_2")
    module = SimpleNamespace(is_causal=True, config=SimpleNamespace(_attn_implementation="flash_attention_2"))
    gen = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, 4, 7, 8, generator=gen).to(torch.bfloat16) for _ in range(3))
    shard_positions = torch.tensor([[0, 1, 2, 0, 1, 0, 0], [0, 1, 2, 3, 0, 1, 0]])

    output, _ = attend(module, query, key, value, None, position_ids=shard_positions)

    assert reference_fa2.dense_calls == 0, "two packed rows reached flash_attn_func: samples would see each other"
    # Padding (one stretch of it) is a segment of its own, as in the sdpa path's mask.
    assert reference_fa2.varlen_calls == [[0, 3, 5, 7, 11, 13, 14]]
    mask = block_causal_mask(context.global_runs)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query.float(), key.float(), value.float(), attn_mask=mask
    ).transpose(1, 2)
    assert relative(output, expected) < BF16_TOLERANCE


def test_the_attention_table_examples_hold():
    """``attention_policy.py`` is the one list of the attention values Zebra takes (fa3 refused there)."""
    import doctest

    from llamafactory_zebra import attention_policy

    results = doctest.testmod(attention_policy, optionflags=doctest.ELLIPSIS)
    assert results.attempted >= 2 and results.failed == 0
    with pytest.raises(ValueError, match="'fa4' is not one of auto, disabled, sdpa, fa2"):
        attention_policy.attn_implementation_for("fa4")

"""The chunked KD loss equals the full-logits KL (value and gradients) on SFT-shaped batches."""

import pytest
import torch

from llamafactory_zebra.distill.kd_loss import full_logits_kd_loss_sums, kd_loss_sums
from llamafactory_zebra.kernels import Call, Key, Op, this_machine
from llamafactory_zebra.kernels import select as select_kernel
from llamafactory_zebra.loss import IGNORE_INDEX, shifted_targets


def sft_batch(dtype, batch=2, length=37, hidden=16, teacher_hidden=24, vocab=101, seed=0):
    """Two rows: row 0 packs three samples (prompt tokens labelled IGNORE_INDEX), row 1 one sample + padding."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, vocab, (batch, length), generator=g)
    labels[0, 0:5] = IGNORE_INDEX  # sample 1 prompt
    labels[0, 12:18] = IGNORE_INDEX  # sample 2 prompt
    labels[0, 25:27] = IGNORE_INDEX  # sample 3 prompt
    labels[1, 0:9] = IGNORE_INDEX  # prompt
    labels[1, 30:] = IGNORE_INDEX  # padding
    targets = shifted_targets(labels).reshape(-1)
    h_s = torch.randn(batch * length, hidden, generator=g, dtype=dtype) * 2
    w_s = torch.randn(vocab, hidden, generator=g, dtype=dtype) * 0.5
    h_t = torch.randn(batch * length, teacher_hidden, generator=g, dtype=dtype) * 2
    w_t = torch.randn(vocab, teacher_hidden, generator=g, dtype=dtype) * 0.5
    return h_s, w_s, h_t, w_t, targets


def value_and_grads(fn, h_s, w_s, h_t, w_t, targets, **kwargs):
    h_s = h_s.clone().requires_grad_(True)
    w_s = w_s.clone().requires_grad_(True)
    total, kd, ce = fn(h_s, w_s, h_t, w_t, targets, **kwargs)
    (total * 0.37).backward()
    return total.detach(), kd, ce, h_s.grad, w_s.grad


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 2.5])
@pytest.mark.parametrize(("kl_weight", "ce_weight"), [(1.0, 0.0), (0.7, 0.3)])
def test_chunked_kd_matches_full_logits_fp32(reverse, temperature, kl_weight, ce_weight):
    batch = sft_batch(torch.float32)
    kwargs = dict(temperature=temperature, reverse=reverse, kl_weight=kl_weight, ce_weight=ce_weight)
    expected = value_and_grads(full_logits_kd_loss_sums, *batch, **kwargs)
    actual = value_and_grads(kd_loss_sums, *batch, chunk_tokens=7, **kwargs)
    count = int((batch[4] != IGNORE_INDEX).sum())
    for got, want in zip(actual, expected, strict=True):
        # per-token values ~1e-6 (sums over `count` tokens)
        torch.testing.assert_close(got / count, want / count, rtol=1e-6, atol=1e-6)
    assert expected[1] > 0 and expected[3].abs().sum() > 0


def test_chunked_kd_matches_full_logits_fp64_tightly_and_ignores_masked_rows():
    h_s, w_s, h_t, w_t, targets = sft_batch(torch.float64, length=29, vocab=53)
    expected = value_and_grads(full_logits_kd_loss_sums, h_s, w_s, h_t, w_t, targets, ce_weight=0.5)
    actual = value_and_grads(kd_loss_sums, h_s, w_s, h_t, w_t, targets, ce_weight=0.5, chunk_tokens=5)
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    masked = targets == IGNORE_INDEX
    assert masked.any() and actual[3][masked].abs().max() == 0
    # Changing masked rows (prompt, padding, cross-sample borders) changes nothing.
    h_s2 = h_s.clone()
    h_s2[masked] += 5.0
    again = value_and_grads(kd_loss_sums, h_s2, w_s, h_t, w_t, targets, ce_weight=0.5, chunk_tokens=5)
    torch.testing.assert_close(again[0], actual[0], rtol=1e-12, atol=1e-12)


def test_identical_models_have_zero_kd_and_zero_kd_gradient():
    h, w, _, _, targets = sft_batch(torch.float64, teacher_hidden=16)
    total, kd, _, grad_h, grad_w = value_and_grads(kd_loss_sums, h, w, h, w, targets, reverse=True, chunk_tokens=9)
    assert abs(float(kd)) < 1e-12 and grad_h.abs().max() < 1e-12 and grad_w.abs().max() < 1e-12


def test_kd_rejects_mismatched_vocabularies():
    h_s, w_s, h_t, w_t, targets = sft_batch(torch.float32)
    with pytest.raises(ValueError, match="vocabulary 100 vs 101"):
        kd_loss_sums(h_s, w_s, h_t, w_t[:100], targets)


@pytest.mark.skipif(
    select_kernel(Op.DISTILLATION_LOSS, Call.on("cuda"), this_machine()).kernel.key != Key.LIGER,
    reason="Liger's Triton kernels need a CUDA/ROCm GPU and liger-kernel",
)
@pytest.mark.parametrize("reverse", [False, True])
def test_liger_backend_matches_full_logits_on_gpu(reverse):
    batch = [t.cuda() for t in sft_batch(torch.float32, teacher_hidden=16)]
    kwargs = dict(temperature=2.0, reverse=reverse, kl_weight=1.0, ce_weight=0.5)
    expected = value_and_grads(full_logits_kd_loss_sums, *batch, **kwargs)
    actual = value_and_grads(kd_loss_sums, *batch, force="liger", **kwargs)
    count = int((batch[4] != IGNORE_INDEX).sum())
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got / count, want / count, rtol=1e-4, atol=1e-5)

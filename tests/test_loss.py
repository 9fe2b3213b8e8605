import pytest
import torch
import torch.nn.functional as F

from llamafactory_zebra.loss import chunked_linear_cross_entropy_sum


@pytest.mark.parametrize("chunk_tokens", [1, 4, 7, 64])
def test_chunked_cross_entropy_matches_full_logits(chunk_tokens):
    hidden = torch.randn(23, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(41, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 41, (23,))
    targets[[0, 5, 22]] = -100
    ours = chunked_linear_cross_entropy_sum(hidden, weight, targets, chunk_tokens=chunk_tokens)
    reference = F.cross_entropy(hidden @ weight.T, targets, ignore_index=-100, reduction="sum")
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
    # A scaling applied after the loss (token weighting, gradient accumulation) must reach the gradients.
    grads = torch.autograd.grad(ours * 0.37, [hidden, weight])
    expected = torch.autograd.grad(reference * 0.37, [hidden, weight])
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_chunked_cross_entropy_keeps_bf16_hidden_dtype_for_gradients():
    hidden = torch.randn(9, 8, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(11, 8, dtype=torch.bfloat16, requires_grad=True)
    loss = chunked_linear_cross_entropy_sum(hidden, weight, torch.randint(0, 11, (9,)), chunk_tokens=4)
    assert loss.dtype == torch.float32
    loss.backward()
    assert hidden.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.bfloat16


def test_chunked_cross_entropy_rejects_bad_shapes():
    with pytest.raises(ValueError, match="hidden must be"):
        chunked_linear_cross_entropy_sum(torch.zeros(2, 3, 4), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long))

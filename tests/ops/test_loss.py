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


@pytest.mark.parametrize("tiles", [0, 3, 4, 7])
def test_tiled_mlp_gives_the_dense_loss_and_gradients_under_scaling(tiles):
    from llamafactory_zebra.layers.tiled_mlp import tile_count
    from llamafactory_zebra.testing.models import tiny_model

    tokens = torch.randint(0, 97, (2, 29))
    results = []
    for tiled in (False, True):
        torch.manual_seed(0)
        model = tiny_model(hidden_size=16, intermediate_size=32, q_lora_rank=24, kv_lora_rank=8).train()
        if tiled:
            model.enable_tiled_mlp(tiles)
        loss = model(tokens, labels=tokens).loss
        (loss * 0.37).backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-12, atol=1e-12)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, rtol=1e-9, atol=1e-12)
    assert tile_count(29, 16, 0) == 2 and tile_count(9, 64, 4) == 3  # torch.chunk yields 3 tiles of 3


def test_tiled_mlp_rejects_negative_counts():
    from llamafactory_zebra.testing.models import tiny_model

    with pytest.raises(ValueError, match="tiles"):
        tiny_model().enable_tiled_mlp(-1)


def test_ignore_index_is_llamafactorys():
    from llamafactory.extras.constants import IGNORE_INDEX as LLAMAFACTORY_IGNORE_INDEX

    from llamafactory_zebra.loss import IGNORE_INDEX

    assert IGNORE_INDEX == LLAMAFACTORY_IGNORE_INDEX

"""LLaMA-Factory's own packing processor and collator feed the model: the packed loss must equal the
per-sample losses combined the same way (token-weighted), for ``packing`` and ``neat_packing``."""

import pytest
import torch
import torch.nn.functional as F

from llamafactory_zebra.testing.models import tiny_model

CONVERSATIONS = [
    ("hi there", "hello"),
    ("what is 2+2?", "4"),
    ("x", "y z"),
    ("name three colours", "red, green and blue"),
    ("and one more", "ok"),
]


def _packed_batch(neat_packing: bool, attn_implementation: str):
    from llamafactory.data import get_template_and_fix_tokenizer
    from llamafactory.data.collator import SFTDataCollatorWith4DAttentionMask
    from llamafactory.data.processor.supervised import PackedSupervisedDatasetProcessor
    from llamafactory.hparams import DataArguments

    from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    data_args = DataArguments(template="zebra", cutoff_len=64, packing=True, neat_packing=neat_packing)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    processor = PackedSupervisedDatasetProcessor(
        template=template, tokenizer=tokenizer, processor=None, data_args=data_args
    )
    n = len(CONVERSATIONS)
    examples = {
        "_prompt": [[{"role": "user", "content": q}] for q, _ in CONVERSATIONS],
        "_response": [[{"role": "assistant", "content": a}] for _, a in CONVERSATIONS],
        "_system": [""] * n,
        "_tools": [""] * n,
        "_images": [None] * n,
        "_videos": [None] * n,
        "_audios": [None] * n,
    }
    packed = processor.preprocess_dataset(examples)
    # The collator the SFT workflow builds for Zebra: the parser seam clears block_diag_attn.
    collator = SFTDataCollatorWith4DAttentionMask(
        template=template,
        tokenizer=tokenizer,
        processor=None,
        block_diag_attn=False,
        attn_implementation=attn_implementation,
        neat_packing=neat_packing,
        label_pad_token_id=-100,
    )
    keys = ("input_ids", "attention_mask", "labels", "position_ids")
    features = [{k: packed[k][i] for k in keys} for i in range(len(packed["input_ids"]))]
    return collator(features), tokenizer


def _per_sample_sums(model, batch):
    """Run every packed sample alone; return (sum of its token losses, number of its target tokens)."""
    total, count = 0.0, 0
    for row in range(batch["input_ids"].shape[0]):
        positions = batch["position_ids"][row]
        starts = [i for i in range(positions.shape[0]) if positions[i] == 0]
        borders = [*starts, positions.shape[0]]
        for start, end in zip(borders[:-1], borders[1:], strict=True):
            labels = batch["labels"][row, start:end]
            if (labels != -100).sum() == 0:
                continue
            logits = model(batch["input_ids"][row : row + 1, start:end], use_cache=False).logits[0]
            total = total + F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="sum")
            count += int((labels[1:] != -100).sum())
    return total, count


@pytest.fixture(scope="module", params=[True, False], ids=["neat_packing", "packing"])
def packed_case(request):
    """One packed batch, a fresh-model recipe and its per-sample reference, shared by the loss variants."""
    torch.manual_seed(0)
    batch, tokenizer = _packed_batch(request.param, "sdpa")
    model = tiny_model(vocab_size=len(tokenizer), attn_implementation="sdpa")
    with torch.no_grad():
        total, count = _per_sample_sums(model, batch)
    return batch, model.state_dict(), len(tokenizer), total, count


@pytest.mark.parametrize("fused", [False, True])
def test_packed_loss_equals_per_sample_losses(packed_case, fused):
    batch, weights, vocab_size, total, count = packed_case
    assert batch["attention_mask"].dim() == 2  # no dense 4-D mask built by the collator
    model = tiny_model(vocab_size=vocab_size, attn_implementation="sdpa").train()
    model.load_state_dict(weights)
    if fused:
        model.enable_fused_cross_entropy("chunked")
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids", "labels")}
    loss = model(**inputs).loss
    assert count > 10
    torch.testing.assert_close(loss.double(), (total / count).double(), rtol=1e-6, atol=1e-6)

"""DPO's and KTO's log-probabilities of a padded batch equal each sequence's alone (left and right padding, fp32).

The batch is built by LLaMA-Factory's own pairwise and KTO collators from the README fixtures (tokenized by
``get_dataset``), and the log-probabilities come from LLaMA-Factory's own trainer methods
(``CustomDPOTrainer.concatenated_forward``, ``CustomKTOTrainer.concatenated_forward``) on the tiny Zebra. The
reference is each sequence run alone, unpadded, through the same ``get_batch_logps``. Padding must not leak
into a real token's state: GDN's recurrence and the causal convolution see left padding first.
"""

from types import SimpleNamespace

import pytest
import torch
from llamafactory.data import (
    KTODataCollatorWithPadding,
    PairwiseDataCollatorWithPadding,
)
from llamafactory.extras.constants import IGNORE_INDEX
from llamafactory.train.dpo.trainer import CustomDPOTrainer
from llamafactory.train.kto.trainer import CustomKTOTrainer
from llamafactory.train.trainer_utils import get_batch_logps
from llamafactory_data import load_with_llamafactory
from repo_paths import FIXTURES

from llamafactory_zebra import ZebraForCausalLM

pytestmark = pytest.mark.usefixtures("dataset_seams", "one_torch_thread")

README = FIXTURES / "llamafactory_readme"


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return ZebraForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def _features(tiny_model_dir, tmp_path, datasets, stage):
    values = {
        "model_name_or_path": str(tiny_model_dir),
        "dataset": datasets,
        "dataset_dir": str(README),
        "template": "zebra",
        "cutoff_len": 256,
        "output_dir": str(tmp_path),
    }
    dataset_module, template, tokenizer_module = load_with_llamafactory(values, stage)
    dataset = dataset_module["train_dataset"]
    return [dataset[i] for i in range(len(dataset))], template, tokenizer_module


def _alone(model, input_ids, labels):
    """One sequence, no padding, through LLaMA-Factory's ``get_batch_logps``."""
    ids, targets = torch.tensor([input_ids]), torch.tensor([labels])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits.float()
    return get_batch_logps(logits, targets)[0][0]


def _collator(cls, template, tokenizer_module, model, side):
    tokenizer_module["tokenizer"].padding_side = side
    return cls(
        template=template, model=model, pad_to_multiple_of=8, label_pad_token_id=IGNORE_INDEX, **tokenizer_module
    )


@pytest.mark.parametrize("side", ["left", "right"])
def test_dpo_pair_logps_padded_equal_alone(side, model, tiny_model_dir, tmp_path):
    features, template, tokenizer_module = _features(
        tiny_model_dir, tmp_path, "sharegpt_preference,alpaca_preference", "rm"
    )
    batch = _collator(PairwiseDataCollatorWithPadding, template, tokenizer_module, model, side)(features)
    assert (batch["attention_mask"] == 0).any()  # the batch really is padded
    trainer = SimpleNamespace(finetuning_args=SimpleNamespace(use_ref_model=False), loss_type="sigmoid", ld_alpha=None)
    with torch.no_grad():
        padded = CustomDPOTrainer.concatenated_forward(trainer, model, batch)
    for key in ("chosen", "rejected"):
        alone = torch.stack([_alone(model, f[f"{key}_input_ids"], f[f"{key}_labels"]) for f in features])
        torch.testing.assert_close(padded[f"{key}_logps"], alone, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("side", ["left", "right"])
def test_kto_target_and_kl_logps_padded_equal_alone(side, model, tiny_model_dir, tmp_path):
    features, template, tokenizer_module = _features(tiny_model_dir, tmp_path, "alpaca_kto,sharegpt_kto", "kto")
    batch = _collator(KTODataCollatorWithPadding, template, tokenizer_module, model, side)(features)
    assert (batch["attention_mask"] == 0).any() and (batch["kl_attention_mask"] == 0).any()
    trainer = SimpleNamespace(forward=lambda *args, **kwargs: CustomKTOTrainer.forward(None, *args, **kwargs))
    with torch.no_grad():
        chosen, rejected, _, _, kl, _ = CustomKTOTrainer.concatenated_forward(trainer, model, batch)
    tags = torch.tensor([f["kto_tags"] for f in features])
    target = torch.stack([_alone(model, f["input_ids"], f["labels"]) for f in features])
    kl_alone = torch.stack([_alone(model, f["kl_input_ids"], f["kl_labels"]) for f in features])
    assert tags.any() and (~tags).any()
    torch.testing.assert_close(chosen, target[tags], rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(rejected, target[~tags], rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(kl, kl_alone, rtol=1e-5, atol=2e-5)

"""The shipped example data and YAML fragments are valid LLaMA-Factory input."""

import pytest
import yaml
from llamafactory.hparams import DataArguments, FinetuningArguments, ModelArguments, TrainingArguments
from repo_paths import EXAMPLES
from transformers import HfArgumentParser

from llamafactory_zebra.data.inspection import inspect_training_data
from llamafactory_zebra.integration.datasets import check_dataset_names

pytestmark = pytest.mark.usefixtures("dataset_seams")


def _inspect(tmp_path, tiny_tokenizer_dir, dataset, dataset_dir):
    config = {
        "model_name_or_path": str(tiny_tokenizer_dir),
        "stage": "sft",
        "dataset": dataset,
        "dataset_dir": str(dataset_dir),
        "template": "qwen3",
        "cutoff_len": 512,
        "packing": True,
        "overwrite_cache": True,
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return inspect_training_data(str(path), show_progress=False)


def test_demo_mix_converts_without_drops(tmp_path, tiny_tokenizer_dir):
    (demo,) = _inspect(tmp_path, tiny_tokenizer_dir, "zebra_demo", EXAMPLES / "data").datasets
    assert 50 <= demo.rows_read <= 200
    assert demo.rows_kept == demo.rows_read and demo.rows_truncated == 0


def test_custom_dataset_examples_convert_without_drops(tmp_path, tiny_tokenizer_dir):
    config = yaml.safe_load((EXAMPLES / "custom_dataset" / "train_custom.yaml").read_text())
    report = _inspect(tmp_path, tiny_tokenizer_dir, config["dataset"], EXAMPLES / "custom_dataset")
    assert [(r.name, r.rows_read, r.rows_kept) for r in report.datasets] == [
        ("my_alpaca", 3, 3),
        ("my_alpaca_parquet", 2, 2),
        ("my_sharegpt", 2, 2),
        ("my_messages", 2, 2),
        ("my_long_doc_qa", 2, 2),
    ]


def test_recipe_fragment_holds_only_llamafactory_keys_and_known_names(tmp_path):
    fragment = yaml.safe_load((EXAMPLES / "recipe_mixture.yaml").read_text())
    parser = HfArgumentParser([ModelArguments, DataArguments, TrainingArguments, FinetuningArguments])
    _, data_args, training_args, _ = parser.parse_dict(
        {**fragment, "model_name_or_path": "unused", "output_dir": str(tmp_path)}, allow_extra_keys=False
    )
    assert len(data_args.dataset) == len(data_args.interleave_probs) == 6
    assert sum(data_args.interleave_probs) == pytest.approx(1.0)
    assert data_args.streaming and training_args.max_steps > 0
    check_dataset_names(data_args.dataset, str(tmp_path))

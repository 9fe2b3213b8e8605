"""``data inspect`` numbers against hand-computed values, and against LLaMA-Factory's own pipeline.

Fixture ``known_lengths`` (tests/fixtures/datasets) holds user/assistant turns made of digits; the
tiny tokenizer splits digits one token each, and a single qwen3 turn without reasoning costs 16
template tokens (checked in ``test_template_overhead_is_16_tokens``), so a row of q + a digits is
16 + q + a tokens. Rows (index: tokens): 0: 20, 1: 30, 2: broken role order, 3: 40, 4: empty
response, 5: 50, 6: 80, 7: null messages, 8: 26. ``known_lengths_alpaca``: 24, 34, 44.
"""

import json

import llamafactory.data.converter  # noqa: F401  (imported before the seams, like training does)
import pytest
import yaml
from llamafactory.data.template import get_template_and_fix_tokenizer
from llamafactory.hparams import DataArguments
from repo_paths import FIXTURES

from llamafactory_zebra.cli.main import main
from llamafactory_zebra.data.inspection import inspect_training_data, load_train_arguments, mixture_order
from llamafactory_zebra.data.report_arithmetic import count_packs, length_summary, map_batches
from llamafactory_zebra.hparams.optimizer_steps import optimizer_steps_per_epoch
from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer

DATASETS = FIXTURES / "datasets"
pytestmark = pytest.mark.usefixtures("dataset_seams")


@pytest.fixture
def write_config(tmp_path, tiny_tokenizer_dir):
    def write(**overrides):
        config = {
            "model_name_or_path": str(tiny_tokenizer_dir),
            "stage": "sft",
            "do_train": True,
            "finetuning_type": "full",
            "dataset": "known_lengths",
            "dataset_dir": str(DATASETS),
            "template": "qwen3",
            "cutoff_len": 64,
            "packing": True,
            "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": 1,
            "deepspeed": "examples/deepspeed/not_needed_for_inspection.json",
            "overwrite_cache": True,
        }
        config.update(overrides)
        path = tmp_path / "train.yaml"
        path.write_text(yaml.safe_dump(config))
        return str(path)

    return write


def test_template_overhead_is_16_tokens():
    tokenizer = build_tiny_tokenizer()
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template="qwen3"))
    prompt, response = template.encode_oneturn(
        tokenizer, [{"role": "user", "content": "12"}, {"role": "assistant", "content": "345"}]
    )
    assert tokenizer.convert_ids_to_tokens(prompt + response) == (
        ["<|im_start|>", "user", "Ċ", "1", "2", "<|im_end|>", "Ċ", "<|im_start|>", "assistant", "Ċ"]
        + ["<think>", "Ċ", "Ċ", "</think>", "Ċ", "Ċ", "3", "4", "5", "<|im_end|>", "Ċ"]
    )


def test_map_batches_follow_datasets_contiguous_shards():
    assert map_batches(9, 4, None) == [range(0, 4), range(4, 8), range(8, 9)]
    # datasets gives the first (9 % 2) shards one extra row: [0, 5) and [5, 9).
    assert map_batches(9, 4, 2) == [range(0, 4), range(4, 5), range(5, 9)]
    assert map_batches(2, 4, 8) == [range(0, 1), range(1, 2)]


def test_steps_per_epoch_counts_like_the_trainer():
    assert optimizer_steps_per_epoch(4, 1, 1, 1, False) == 4
    assert optimizer_steps_per_epoch(4, 1, 1, 3, False) == 2  # 4 batches over 3 ranks: 2 on each rank
    assert optimizer_steps_per_epoch(5, 2, 2, 1, False) == 2  # 3 batches, accumulation windows of 2: 2 steps
    assert optimizer_steps_per_epoch(5, 2, 2, 1, True) == 1  # drop_last: 2 batches
    assert optimizer_steps_per_epoch(0, 2, 2, 1, False) == 0


def test_count_packs_and_length_summary_by_hand():
    lengths = [20, 30, None, 40, None, 50, 63, None, 26]
    # greedy knapsack at 63: [63], [50], [40, 20], [30, 26]
    assert count_packs(lengths, [range(9)], 63) == 4
    assert count_packs(lengths, map_batches(9, 4, None), 63) == 5  # [40,20],[30] | [63],[50] | [26]
    assert length_summary([20, 26, 30, 40, 50, 80]) == {
        "p50": 35.0,
        "p90": 65.0,
        "p99": 78.5,
        "mean": 41.0,
        "max": 80.0,
    }


def test_inspect_known_lengths(write_config):
    report = inspect_training_data(write_config(), world_size=3, show_progress=False)
    (known,) = report.datasets
    assert (known.rows_read, known.rows_kept, known.rows_truncated) == (9, 6, 1)
    assert known.rows_dropped == {"broken role order": 1, "empty response": 1, "missing value": 1}
    assert known.dropped_rows == {"broken role order": [2], "empty response": [4], "missing value": [7]}
    assert known.token_lengths == {"p50": 35.0, "p90": 65.0, "p99": 78.5, "mean": 41.0, "max": 80.0}
    assert known.train_tokens == 20 + 30 + 40 + 50 + 63 + 26  # row 6 truncated to cutoff_len - 1
    assert known.packed_sequences == 4
    assert known.packing_efficiency == pytest.approx(229 / (4 * 64))
    assert known.steps_per_epoch == 2
    assert report.mixture.packed_sequences == 4
    assert report.settings["cutoff_len"] == 64 and report.settings["sequences_per_step"] == 3
    assert sorted(report.lengths["known_lengths"]) == [20, 26, 30, 40, 50, 80]


def test_sequence_parallel_ranks_share_batches(write_config):
    config = write_config(sequence_parallel_size=2)
    assert inspect_training_data(config, show_progress=False).settings["data_parallel_size"] == 1
    report = inspect_training_data(config, world_size=6, show_progress=False)
    assert report.settings["data_parallel_size"] == 3 and report.datasets[0].steps_per_epoch == 2
    with pytest.raises(ValueError, match=r"sequence_parallel_size=2 does not divide the number of processes \(3\)"):
        inspect_training_data(config, world_size=3, show_progress=False)


def test_preprocessing_batches_change_the_packing(write_config):
    report = inspect_training_data(write_config(preprocessing_batch_size=4), show_progress=False)
    assert report.datasets[0].packed_sequences == 5
    assert report.datasets[0].packing_efficiency == pytest.approx(229 / (5 * 64))
    assert report.datasets[0].steps_per_epoch == 5


def test_without_packing_every_row_is_a_sequence(write_config):
    report = inspect_training_data(
        write_config(packing=False, per_device_train_batch_size=2, gradient_accumulation_steps=2), show_progress=False
    )
    known = report.datasets[0]
    assert known.sequences == 6 and known.rows_truncated == 1
    assert known.train_tokens == 20 + 30 + 40 + 50 + 64 + 26  # truncated at cutoff_len itself
    assert known.steps_per_epoch == 2  # 3 batches of 2, accumulation 2


def test_mixture_packing_matches_llamafactorys_own_dataset(write_config):
    """The packed sequences LLaMA-Factory's get_dataset builds for the same YAML, counted directly."""
    from llamafactory.data import get_dataset
    from llamafactory.model import load_tokenizer

    config = write_config(dataset="known_lengths,known_lengths_alpaca", neat_packing=True)
    report = inspect_training_data(config, show_progress=False)
    # concat order, knapsack at 63 over [20,30,40,50,63,26,24,34,44]: [63] [50] [44] [40,20] [34,26] [30,24]
    assert report.mixture.packed_sequences == 6
    assert report.mixture.train_tokens == 229 + 102
    assert report.mixture.packing_efficiency == pytest.approx(331 / (6 * 64))

    run = load_train_arguments(config)
    model_args, data_args, training_args = run.model, run.data, run.training
    tokenizer = load_tokenizer(model_args)["tokenizer"]
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    train = get_dataset(template, model_args, data_args, training_args, "sft", tokenizer)["train_dataset"]
    assert len(train) == report.mixture.packed_sequences
    assert sum(sum(1 for segment in mask if segment > 0) for mask in train["attention_mask"]) == 331
    assert {len(ids) for ids in train["input_ids"]} == {64}


def test_interleaved_mixture_order_is_llamafactorys_and_seeded():
    import llamafactory.data.parser as parser_module
    from llamafactory.data.data_utils import merge_dataset
    from llamafactory.data.loader import _load_single_dataset
    from llamafactory.hparams import ModelArguments
    from transformers import Seq2SeqTrainingArguments

    data_args = DataArguments(
        dataset="known_lengths,known_lengths_alpaca",
        dataset_dir=str(DATASETS),
        mix_strategy="interleave_over",
        interleave_probs="0.3,0.7",
        overwrite_cache=True,
    )
    attrs = parser_module.get_dataset_list(data_args.dataset, data_args.dataset_dir)
    args = (
        ModelArguments(model_name_or_path="unused"),
        data_args,
        Seq2SeqTrainingArguments("unused", report_to="none"),
    )
    parts = [_load_single_dataset(attr, *args) for attr in attrs]
    real = [json.dumps(row["_prompt"]) for row in merge_dataset(parts, data_args, seed=7)]
    order = mixture_order([len(part) for part in parts], data_args, seed=7)
    assert [json.dumps(parts[source][row]["_prompt"]) for source, row in order] == real
    assert mixture_order([30, 30], data_args, seed=7) == mixture_order([30, 30], data_args, seed=7)
    assert mixture_order([30, 30], data_args, seed=7) != mixture_order([30, 30], data_args, seed=8)


def test_per_dataset_caps_are_exact_and_seeded(write_config):
    config = write_config(dataset="openmath_capped,known_lengths", max_samples=None)
    first = inspect_training_data(config, show_progress=False)
    assert first.datasets[0].rows_read == 2  # num_samples from the zebra_base entry
    again = inspect_training_data(config, show_progress=False)
    assert again.lengths == first.lengths


def test_streaming_reads_at_most_the_row_limit_and_flags_llamafactorys_empty_stream(write_config):
    report = inspect_training_data(write_config(streaming=True, max_steps=10), show_progress=False)
    assert report.datasets[0].rows_read == 0
    assert "dataloader_num_workers is 0" in report.datasets[0].notes[0]
    report = inspect_training_data(
        write_config(streaming=True, max_steps=10, dataloader_num_workers=1), max_rows=5, show_progress=False
    )
    assert report.datasets[0].rows_read == 5 and report.settings["row_limit"] == 5
    assert report.settings["total_steps"] == 10


@pytest.mark.parametrize(
    ("dataset", "kind", "count"),
    [("wrong_type_response", "wrong type", 3), ("messages_wrong_type", "wrong type", 2)],
)
def test_bad_rows_are_counted_by_reason(write_config, dataset, kind, count):
    report = inspect_training_data(write_config(dataset=dataset), show_progress=False)
    assert report.datasets[0].rows_dropped == {kind: count}
    assert report.datasets[0].packed_sequences == 0


def test_cli_writes_json_and_histogram(write_config, tmp_path, capsys):
    output = tmp_path / "inspect"
    code = main(["data", "inspect", write_config(), "--output-dir", str(output), "--json", "--world-size", "3"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((output / "report.json").read_text())
    assert printed["datasets"][0]["packed_sequences"] == 4 and printed["mixture"]["steps_per_epoch"] == 2
    assert (output / "token_lengths.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_table_names_dropped_rows(write_config, tmp_path, capsys):
    assert main(["data", "inspect", write_config(), "--output-dir", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "dropped [known_lengths] broken role order x1: rows 2" in out
    assert "89.5%" in out


@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        ("no_such_set", "Unknown dataset 'no_such_set'. Datasets in"),
        ("missing_column", "Dataset 'missing_column': column 'answer' (columns.response) not found"),
    ],
)
def test_cli_reports_bad_configs_clearly(write_config, tmp_path, capsys, dataset, message):
    assert main(["data", "inspect", write_config(dataset=dataset), "--output-dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_cli_lists_registry(capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "chatqa2_narrativeqa_131k" in out and "NarrativeQA_131072" in out

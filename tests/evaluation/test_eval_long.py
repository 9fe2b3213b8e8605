"""eval-long: task generators, scorer, chunked prefill, bad input, and that the evaluation can tell a
model that retrieves from one that does not."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from llamafactory_zebra import ZebraConfig, ZebraForCausalLM
from llamafactory_zebra.cli.eval_long_run_cmd import check_lengths, parse_lengths
from llamafactory_zebra.cli.main import main
from llamafactory_zebra.evaluation.haystack import HaystackTooShort, file_haystack, noise_haystack
from llamafactory_zebra.evaluation.prefill import chunked_packed_logits, chunked_prefill
from llamafactory_zebra.evaluation.runner import PromptFormat, generate_answers
from llamafactory_zebra.evaluation.scoring import first_number, match_all, match_part, score_sample
from llamafactory_zebra.evaluation.tasks import (
    DEPTH_TASKS,
    TASKS,
    TaskOptions,
    check_task_names,
    depth_grid,
    generate_samples,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def prompt_format(tiny_tokenizer):
    return PromptFormat(tiny_tokenizer)


def measure_with(prompt_format, extra=0):
    return lambda sample: len(prompt_format.ids(sample)) + extra


@pytest.mark.parametrize("task", list(TASKS))
def test_generators_are_deterministic_fit_the_length_and_hold_their_answers(task, prompt_format):
    haystack = noise_haystack(prompt_format.encode_text)
    measure = measure_with(prompt_format)

    def make(seed):
        return generate_samples(task, 1536, 3, measure, haystack, seed=seed, depths=depth_grid(3))

    first, again, other = make(7), make(7), make(8)
    assert first == again
    assert [s.prompt for s in first] != [s.prompt for s in other]
    for sample in first:
        assert 0.8 * 1536 <= measure(sample) <= 1536
        for answer in sample.answers:
            assert answer in sample.context
        assert not any(answer in sample.question + sample.answer_prefix for answer in sample.answers[:1]) or (
            task == "variable_tracking"
        )
    if task in DEPTH_TASKS:
        assert [s.depth for s in first] == [0.0, 0.5, 1.0]
        # depth 0 puts the needle before any filler, depth 1 after all of it
        assert first[0].context.index(first[0].answers[0]) < first[2].context.index(first[2].answers[0]) or (
            len(first[0].context) != len(first[2].context)
        )


def test_needle_depth_is_where_the_sample_says(prompt_format):
    haystack = noise_haystack(prompt_format.encode_text)
    measure = measure_with(prompt_format)
    for depth in (0.0, 0.25, 0.75, 1.0):
        sample = generate_samples("niah_single", 2048, 1, measure, haystack, depths=[depth])[0]
        where = sample.context.index(sample.answers[0]) / len(sample.context)
        assert abs(where - depth) < 0.05, (depth, where)


def test_passkey_is_the_papers_prompt_at_any_length_and_depth(prompt_format):
    haystack = noise_haystack(prompt_format.encode_text)
    measure = measure_with(prompt_format, extra=16)
    filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
    for length in (300, 1024, 3000):
        for sample in generate_samples("passkey", length, 3, measure, haystack, seed=length, depths=depth_grid(3)):
            (key,) = sample.answers
            assert len(key) == 5 and key.isdigit() and key[0] != "0"
            assert sample.context.startswith(
                "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
                "I will quiz you about the important information there. "
            )
            assert f"The pass key is {key}. Remember it. {key} is the pass key." in sample.context
            assert sample.prompt.endswith("\n\nWhat is the pass key?")
            assert sample.answer_prefix == "The pass key is" and sample.metric == "first_number"
            assert 0.8 * length <= measure(sample) <= length
            # The filler is the standard one, repeated (from a seeded sentence of it).
            body = sample.context.replace(f" The pass key is {key}. Remember it. {key} is the pass key.", "")
            assert filler in body + " " + filler or length < 400
    deep, shallow = (
        generate_samples("passkey", 2048, 1, measure, haystack, depths=[depth])[0] for depth in (0.9, 0.1)
    )
    assert deep.context.index(deep.answers[0]) / len(deep.context) > 0.85
    assert shallow.context.index(shallow.answers[0]) / len(shallow.context) < 0.15


def test_passkey_scores_the_first_number_of_the_answer():
    assert first_number(" 12345.", ["12345"]) == 1.0
    assert first_number(" 12345 is the pass key, not 54321.", ["12345"]) == 1.0
    assert first_number(" 123456.", ["12345"]) == 0.0  # substring matching would have said 1
    assert first_number(" 54321 or 12345", ["12345"]) == 0.0
    assert first_number(" I do not know.", ["12345"]) == 0.0
    assert score_sample("The pass key is 1234", ["12345"], "first_number") == 0.0


def test_scorer_on_hand_made_outputs():
    assert match_all("The special magic number is 1234567.", ["1234567"]) == 1.0
    assert match_all("The special magic number is 7654321.", ["1234567"]) == 0.0
    assert match_all("They are 111, 333 and 999", ["111", "222", "333", "444"]) == 0.5
    assert match_all("WORDS: Lemana, FOSOFI", ["lemana", "fosofi", "kupa"]) == pytest.approx(2 / 3)
    assert match_part("It is Quellin.", ["Quellin", "Zorvania"]) == 1.0
    assert match_part("It is Paris.", ["Quellin", "Zorvania"]) == 0.0
    assert score_sample("VAR ABCDE and FGHIJ", ["ABCDE", "FGHIJ", "KLMNO"], "string_match_all") == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="string_match_all"):
        score_sample("x", ["x"], "exact")


def _tiny(attn="eager", **overrides):
    torch.manual_seed(0)
    return ZebraForCausalLM(ZebraConfig.from_preset("tiny", attn_implementation=attn, **overrides)).eval()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_chunked_prefill_matches_one_shot_logits_with_left_padding(attn):
    model = _tiny(attn)
    ids = torch.randint(3, 1000, (3, 45))
    mask = torch.ones_like(ids)
    mask[1, :13] = 0  # the first chunks of this row are padding only
    mask[2, :3] = 0
    with torch.no_grad():
        reference = model(ids, attention_mask=mask).logits
    for chunk in (5, 16, 64) if attn == "eager" else (16,):
        pieces: list[torch.Tensor] = []
        cache, last = chunked_prefill(
            model, ids, mask, chunk, on_chunk=lambda start, logits, out=pieces: out.append(logits)
        )
        logits = torch.cat(pieces, dim=1)
        for row in range(3):
            real = mask[row] == 1
            torch.testing.assert_close(logits[row, real], reference[row, real], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(last, reference[:, -1], atol=2e-5, rtol=1e-5)
        assert cache.get_seq_length() == 45


def test_chunked_prefill_of_a_packed_batch_matches_the_packed_forward():
    model = _tiny()
    ids = torch.randint(3, 1000, (2, 40))
    positions = torch.stack([torch.cat([torch.arange(17), torch.arange(23)]), torch.cat([torch.arange(40)])])
    with torch.no_grad():
        reference = torch.cat([model(ids[:1], position_ids=positions[:1]).logits, model(ids[1:]).logits])
    for chunk in (6, 16):
        logits = chunked_packed_logits(model, ids, positions, chunk)
        torch.testing.assert_close(logits, reference, atol=2e-5, rtol=1e-5)


def test_generate_with_prefill_chunks_gives_the_one_shot_answers(tiny_tokenizer, prompt_format):
    model = _tiny(vocab_size=len(tiny_tokenizer))
    haystack = noise_haystack(prompt_format.encode_text)
    samples = generate_samples("niah_multikey", 300, 2, measure_with(prompt_format, 8), haystack, seed=3)
    prompts = [prompt_format.ids(sample)[: 290 - 7 * i] for i, sample in enumerate(samples)]
    one_shot = generate_answers(model, tiny_tokenizer, prompts, 8, prefill_chunk_size=4096)
    chunked = generate_answers(model, tiny_tokenizer, prompts, 8, prefill_chunk_size=37)
    assert chunked == one_shot


def test_unknown_task_lists_the_valid_ones(capsys, tmp_path):
    with pytest.raises(ValueError, match="niah_single, niah_multikey"):
        check_task_names(["niah_single", "needle"])
    config = tmp_path / "infer.yaml"
    config.write_text("model_name_or_path: nowhere\n")
    assert main(["eval-long", str(config), "--tasks", "niah_single,needle"]) == 2
    assert "unknown task(s) needle; valid tasks: passkey, niah_single" in capsys.readouterr().err


@pytest.mark.slow
def test_an_unknown_yaml_key_is_the_one_line_the_command_ends_with(tiny_model_dir, tmp_path):
    """LLaMA-Factory's parser would name it at the end of a 20-line traceback, after loading had begun."""
    import subprocess
    import sys
    from pathlib import Path

    command = str(Path(sys.executable).parent / "llamafactory-zebra")  # the console script of this environment
    config = tmp_path / "infer.yaml"
    config.write_text(
        yaml.safe_dump({"model_name_or_path": str(tiny_model_dir), "template": "zebra", "temprature": 0.5})
    )
    result = subprocess.run(
        [command, "eval-long", str(config), "--lengths", "256", "--output-dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        f"error: {config}: unknown key(s) 'temprature' (did you mean 'temperature'?); an inference YAML takes the "
        "keys of `llamafactory-cli chat` (LLaMA-Factory's model, data, finetuning and generating arguments)"
    )
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_lengths_beyond_max_position_embeddings_fail_with_the_numbers(capsys, tmp_path):
    assert parse_lengths("4k, 16K,1m,300") == [4096, 16384, 1048576, 300]
    with pytest.raises(ValueError, match="'4kb' is not a length"):
        parse_lengths("4kb")
    with pytest.raises(ValueError, match=r"8192 exceed the model's max_position_embeddings \(4096\)"):
        check_lengths([1024, 8192], 4096, allow_beyond=False)
    assert "extrapolation" in check_lengths([8192], 4096, allow_beyond=True)[0]
    from llamafactory_zebra.cli.init_cmd import write_random_model

    model_dir = write_random_model("tiny", tmp_path / "tiny")
    config = tmp_path / "infer.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(model_dir), "template": "zebra"}))
    assert main(["eval-long", str(config), "--lengths", "2k,8k", "--output-dir", str(tmp_path / "out")]) == 2
    assert "8192 exceed the model's max_position_embeddings (4096)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_haystack_file_too_short_is_an_error_with_the_token_counts(prompt_format, tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("Only a few sentences here. Nothing more to read. The end.")
    haystack = file_haystack(text, prompt_format.encode_text)
    with pytest.raises(HaystackTooShort, match=r"short.txt has about \d+ tokens, but this length needs \d+"):
        generate_samples("niah_single", 1024, 1, measure_with(prompt_format), haystack)
    long_text = tmp_path / "long.txt"
    long_text.write_text(" ".join(f"Sentence number {i} is about the river." for i in range(400)))
    sample = generate_samples(
        "niah_single", 1024, 1, measure_with(prompt_format), file_haystack(long_text, prompt_format.encode_text)
    )[0]
    assert "the river" in sample.context and sample.answers[0] in sample.context


def _retrieval_batch(rows, tokenizer, start, size):
    batch = [rows[(start + i) % len(rows)] for i in range(size)]
    width = max(len(prompt) + len(answer) for prompt, answer in batch)
    ids = torch.full((size, width), tokenizer.pad_token_id)
    labels = torch.full((size, width), -100)
    for row, (prompt, answer) in enumerate(batch):
        sequence = prompt + answer
        ids[row, : len(sequence)] = torch.tensor(sequence)
        labels[row, len(prompt) : len(sequence)] = torch.tensor(answer)
    return ids, labels


def _niah_score(model, tokenizer, prompt_format, samples):
    answers = generate_answers(model.eval(), tokenizer, [prompt_format.ids(s) for s in samples], 2, 4096)
    return (
        100 * sum(score_sample(a, s.answers, s.metric) for a, s in zip(answers, samples, strict=True)) / len(samples)
    )


@pytest.mark.slow
def test_a_model_trained_on_retrieval_scores_above_chance_and_the_untrained_one_does_not(
    tiny_tokenizer, prompt_format
):
    """One-digit needles at 128 tokens: chance is 10 %. Two MLA layers learn the lookup in ~150 steps."""
    haystack = noise_haystack(prompt_format.encode_text)
    options = TaskOptions(value_digits=1)
    depths = depth_grid(8)
    measure = measure_with(prompt_format, 2)
    train = generate_samples("niah_single", 128, 512, measure, haystack, seed=1, depths=depths, options=options)
    test = generate_samples("niah_single", 128, 40, measure, haystack, seed=2, depths=depths, options=options)
    rows = [(prompt_format.ids(s), prompt_format.encode_text(" " + s.answers[0])) for s in train]
    config = ZebraConfig.from_preset(
        "tiny",
        vocab_size=len(tiny_tokenizer),
        pad_token_id=tiny_tokenizer.pad_token_id,
        eos_token_id=tiny_tokenizer.eos_token_id,
        num_hidden_layers=2,
        layer_types=["mla", "mla"],
    )
    torch.manual_seed(0)
    model = ZebraForCausalLM(config)
    untrained = _niah_score(model, tiny_tokenizer, prompt_format, test)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(160):
        ids, labels = _retrieval_batch(rows, tiny_tokenizer, 16 * step, 16)
        loss = model(ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    trained = _niah_score(model, tiny_tokenizer, prompt_format, test)
    assert untrained <= 15, untrained
    assert trained >= 40, trained


@pytest.mark.slow
def test_eval_long_command_writes_scores_heatmap_and_perplexity_curve(tmp_path):
    from llamafactory_zebra.cli.init_cmd import write_random_model

    model_dir = write_random_model("tiny", tmp_path / "tiny")
    config = tmp_path / "infer.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(model_dir), "template": "zebra"}))
    document = tmp_path / "doc.txt"
    document.write_text(" ".join(f"The river number {i} runs through the old town." for i in range(120)))
    out = tmp_path / "out"
    argv = ["eval-long", str(config), "--tasks", "niah_single,qa_synthetic", "--lengths", "384,512"]
    argv += ["--samples", "2", "--depths", "2", "--max-new-tokens", "3", "--prefill-chunk-size", "128"]
    argv += ["--ppl-file", str(document), "--ppl-bins", "4", "--output-dir", str(out)]
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["scores"]) == {"niah_single", "qa_synthetic"}
    assert set(report["scores"]["niah_single"]) == {"384", "512"}
    assert len(report["samples"]) == 8 and all(s["prompt_tokens"] + 3 <= s["length"] for s in report["samples"])
    assert report["depth_heatmap"]["depths"] == [0.0, 1.0]
    assert report["depth_heatmap"]["tasks"] == ["niah_single", "qa_synthetic"]
    # each task's own grid too, and its cells are that task's mean alone
    grid = report["depth_heatmaps"]["qa_synthetic"]
    qa = [
        s["score"]
        for s in report["samples"]
        if s["task"] == "qa_synthetic" and s["length"] == 512 and s["depth"] == 1.0
    ]
    assert grid["tasks"] == ["qa_synthetic"] and grid["scores"][1][1] == pytest.approx(100 * sum(qa) / len(qa))
    assert (out / "depth_heatmap_niah_single.png").is_file() and (out / "depth_heatmap_qa_synthetic.png").is_file()
    assert len(report["perplexity"]["perplexity"]) == 4 and report["perplexity"]["position"][-1] <= 512
    assert (out / "depth_heatmap.png").stat().st_size > 1000
    assert (out / "perplexity.png").stat().st_size > 1000

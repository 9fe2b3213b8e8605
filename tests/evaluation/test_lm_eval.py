"""lm-evaluation-harness (its HF backend) evaluates a Zebra checkpoint offline, in a process that never
imports the plugin (the start-up hook registers Zebra with transformers; see test_load_without_import.py).

Two local tasks (tests/fixtures/lm_eval): a multiple-choice task (loglikelihood requests) and a
generate_until task. Beyond "the metrics exist and are in range", each logged sample is checked against
the model run here: lm-eval's log-likelihood of every choice equals the summed token log-probs, and its
generation equals greedy decoding cut at the stop string.
"""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from installed_hook import assert_installed_hook_is_current
from repo_paths import FIXTURES

pytestmark = pytest.mark.slow

pytest.importorskip("lm_eval")

TASKS = FIXTURES / "lm_eval"


@pytest.fixture(scope="module")
def evaluation(tiny_model_dir, tmp_path_factory):
    assert_installed_hook_is_current()
    work = tmp_path_factory.mktemp("lm_eval")
    shutil.copytree(TASKS, work / "tasks")  # data_files are read relative to the working directory
    env = {key: value for key, value in os.environ.items() if key != "LLAMAFACTORY_ZEBRA_DISABLE"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_DATASETS_CACHE=str(work / "datasets_cache"))
    command = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={tiny_model_dir},dtype=float32",
        "--tasks",
        "zebra_tiny_choice,zebra_tiny_generate",
        "--include_path",
        ".",
        "--device",
        "cpu",
        "--batch_size",
        "2",
        "--log_samples",
        "--output_path",
        str(work / "out"),
    ]
    result = subprocess.run(command, cwd=work / "tasks", env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    (results_file,) = glob.glob(str(work / "out" / "*" / "results_*.json"))
    samples = {
        task: [json.loads(line) for line in open(path)]
        for task in ("zebra_tiny_choice", "zebra_tiny_generate")
        for path in glob.glob(str(work / "out" / "*" / f"samples_{task}_*.jsonl"))
    }
    return json.load(open(results_file))["results"], samples


def test_metrics_exist_and_are_in_range(evaluation):
    results, samples = evaluation
    for task, metrics, count in (
        ("zebra_tiny_choice", ("acc,none", "acc_norm,none"), 4),
        ("zebra_tiny_generate", ("exact_match,none",), 3),
    ):
        assert results[task]["sample_len"] == count == len(samples[task])
        for metric in metrics:
            value = results[task][metric]
            assert isinstance(value, float) and 0.0 <= value <= 1.0, (task, metric, value)


def test_choice_loglikelihoods_equal_the_models_token_logprobs(evaluation, tiny_model_dir):
    from transformers import AutoTokenizer

    from llamafactory_zebra import ZebraForCausalLM

    _, samples = evaluation
    model = ZebraForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    checked = 0
    for sample in samples["zebra_tiny_choice"]:
        requests = [(args["arg_0"], args["arg_1"]) for args in sample["arguments"].values()]
        for (context, continuation), response in zip(requests, sample["resps"], strict=True):
            context_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
            whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logprobs = model(torch.tensor([whole]), use_cache=False).logits[0].log_softmax(-1)
            targets = torch.tensor(whole[len(context_ids) :])
            positions = torch.arange(len(context_ids) - 1, len(whole) - 1)
            expected = logprobs[positions, targets].sum().item()
            assert float(response[0][0]) == pytest.approx(expected, abs=1e-4), (context, continuation)
            checked += 1
    assert checked == 12


def test_generations_equal_greedy_decoding_cut_at_the_stop_string(evaluation, tiny_model_dir):
    from transformers import AutoTokenizer

    from llamafactory_zebra import ZebraForCausalLM

    _, samples = evaluation
    model = ZebraForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for sample in samples["zebra_tiny_generate"]:
        (request,) = sample["arguments"].values()
        context, gen_kwargs = request["arg_0"], request["arg_1"]
        prompt = tokenizer(context, add_special_tokens=False, return_tensors="pt")["input_ids"]
        out = model.generate(prompt, max_new_tokens=gen_kwargs["max_gen_toks"], do_sample=False)
        text = tokenizer.decode(out[0, prompt.shape[1] :], skip_special_tokens=True).split("\n")[0]
        assert sample["resps"][0][0] == text, context

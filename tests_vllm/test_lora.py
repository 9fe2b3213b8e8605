"""LoRA adapters served by vLLM on a Zebra model (``--enable-lora``), against PEFT and the merged exports.

An engine (three adapter slots, ``max_lora_rank`` 32; once fp32, once bf16) serves ONE batch in which the bare base and
three adapters alternate: two PEFT adapters with random B matrices (``lora_target: all`` at rank 8; the
attention and MLP projections only at rank 32) and one trained by ``llamafactory-cli train``
(``lora_target: all``, rank 8). Each request's prompt and generated log-probs are compared with the
transformers model carrying the same adapter in fp32 (PEFT) and with its merged model (PEFT's
``merge_and_unload``; for the trained adapter, ``llamafactory-cli export``). With three adapters loaded,
a request without one reads slot -1 = the last adapter in vLLM's CPU ops unless ``seams.py``'s fix is in.
The references are computed by the training venv (``lora_reference.py``): the vLLM venv has no PEFT.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from llamafactory_zebra.testing.vllm_parity import agreement, errors_between, prompts, serve, start_engine, stop_engine

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TRAINING_PYTHON = Path(os.environ.get("ZEBRA_TRAINING_PYTHON", REPO / ".venv" / "bin" / "python"))
SERVED = [None, "all-r8", "attn-mlp-r32", "lf-all-r8"]
LENGTHS = [5, 33, 2, 70, 17, 1, 48, 9]  # request i carries SERVED[i % 4]
NEW_TOKENS = 4
FP32_TOLERANCE = 1e-3  # the fp32 parity tests' bound
BF16_MULTIPLE = 3.0  # the bf16 parity tests' bound (check_within_bf16_noise)
UNSERVABLE = {
    "dora": ("DoRA", "llamafactory-cli export"),
    "rank-64": ("greater than max_lora_rank 32", "--max-lora-rank 64"),
    "additional-target": ("modules_to_save", "llamafactory-cli export"),
    "head": ("lm_head", "llamafactory-cli export"),
}


def training_venv(command: str, root: Path) -> None:
    if not TRAINING_PYTHON.exists():
        raise FileNotFoundError(
            f"{TRAINING_PYTHON}: the LoRA references need the training venv (PEFT, LLaMA-Factory); "
            "create it with scripts/test.sh or point ZEBRA_TRAINING_PYTHON at its python"
        )
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [str(TRAINING_PYTHON), str(HERE / "lora_reference.py"), command, str(root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from vllm.lora.request import LoRARequest

    root = tmp_path_factory.mktemp("zebra-lora")
    training_venv("build", root)
    vocab = json.loads((root / "base" / "config.json").read_text())["vocab_size"]
    prompt_list = prompts(LENGTHS, vocab)
    adapters = {name: LoRARequest(name, i + 1, str(root / "adapters" / name)) for i, name in enumerate(SERVED[1:])}
    requests = [adapters.get(SERVED[i % len(SERVED)]) for i in range(len(prompt_list))]
    options = {"enable_lora": True, "max_loras": 3, "max_lora_rank": 32}
    llm = start_engine(root / "base", "float32", **options)
    try:
        outputs = {"float32": serve(llm, prompt_list, NEW_TOKENS, lora_request=requests)}
        refusals = {}
        for i, name in enumerate(UNSERVABLE):
            with pytest.raises(Exception) as error:
                llm.llm_engine.add_lora(LoRARequest(name, 100 + i, str(root / "adapters" / name)))
            refusals[name] = str(error.value)
    finally:
        stop_engine(llm)
    llm = start_engine(root / "base", "bfloat16", **options)
    try:
        outputs["bfloat16"] = serve(llm, prompt_list, NEW_TOKENS, lora_request=requests)
    finally:
        stop_engine(llm)
    served_with = [SERVED[i % len(SERVED)] for i in range(len(prompt_list))] * 2
    served = outputs["float32"] + outputs["bfloat16"]
    (root / "requests.json").write_text(
        json.dumps(
            [{"adapter": a, "tokens": s.prompt + s.generated} for a, s in zip(served_with, served, strict=True)]
        )
    )
    training_venv("reference", root)
    references = torch.load(root / "references.pt")
    half = len(prompt_list)
    return {
        "float32": (served_with[:half], outputs["float32"], references[:half]),
        "bfloat16": (served_with[half:], outputs["bfloat16"], references[half:]),
        "refusals": refusals,
    }


def test_fp32_each_request_in_a_mixed_batch_equals_its_own_adapter_and_its_merged_model(run):
    rows = []
    for adapter, served, reference in zip(*run["float32"], strict=True):
        result = agreement(served, reference["fp32"])
        merged = agreement(served, reference["merged"])
        rows.append((adapter, len(served.prompt), result.mean, result.max, merged.mean, merged.max))
        assert result.max < FP32_TOLERANCE, rows[-1]
        assert merged.max < FP32_TOLERANCE, rows[-1]
        assert max(result.greedy_gaps) < FP32_TOLERANCE, rows[-1]
    for row in rows:
        print(
            "fp32 adapter {} prompt {}: vs PEFT mean {:.1e} max {:.1e}; vs merged mean {:.1e} max {:.1e}".format(*row)
        )


def test_bf16_each_request_in_a_mixed_batch_is_within_bf16_noise_of_its_own_adapter(run):
    """vLLM-bf16 against the fp32 PEFT model, per adapter (mean and max over its requests), within
    ``BF16_MULTIPLE`` × the PEFT model's own bf16 error on the same tokens; the merged model agrees alike."""
    by_adapter = {}
    for adapter, served, reference in zip(*run["bfloat16"], strict=True):
        tokens = served.prompt + served.generated
        errors = by_adapter.setdefault(adapter, {"vllm": [], "merged": [], "floor": []})
        errors["vllm"].append(agreement(served, reference["fp32"]))
        errors["merged"].append(agreement(served, reference["merged"]))
        errors["floor"].append(errors_between(reference["fp32"], reference["bf16"], tokens))
    for adapter, errors in by_adapter.items():
        vllm_mean = sum(e.mean for e in errors["vllm"]) / len(errors["vllm"])
        merged_mean = sum(e.mean for e in errors["merged"]) / len(errors["merged"])
        floor_mean = sum(m for m, _ in errors["floor"]) / len(errors["floor"])
        vllm_max, merged_max = max(e.max for e in errors["vllm"]), max(e.max for e in errors["merged"])
        floor_max = max(m for _, m in errors["floor"])
        summary = (
            f"bf16 adapter {adapter}: vLLM vs PEFT-fp32 mean {vllm_mean:.4f} max {vllm_max:.4f}; vs merged "
            f"mean {merged_mean:.4f} max {merged_max:.4f}; PEFT-bf16 floor mean {floor_mean:.4f} max {floor_max:.4f}"
        )
        print(summary)
        assert vllm_mean <= BF16_MULTIPLE * floor_mean, summary
        assert vllm_max <= BF16_MULTIPLE * floor_max, summary
        assert merged_mean <= BF16_MULTIPLE * floor_mean, summary
        assert merged_max <= BF16_MULTIPLE * floor_max, summary


def test_every_adapter_changes_the_output_so_the_batch_check_can_fail(run):
    """A request served with another adapter, or with none, would miss its reference by far more than the
    tolerance: every adapter moves its requests' log-probs away from the base model's."""
    for adapter, served, reference in zip(*run["float32"], strict=True):
        if adapter is not None:
            shift = agreement(served, reference["base"])
            assert shift.mean > 100 * FP32_TOLERANCE, (adapter, len(served.prompt), shift.mean)


def test_unservable_adapters_are_refused_naming_adapter_reason_and_fix(run):
    refusals = run["refusals"]
    for name, (reason, fix) in UNSERVABLE.items():
        message = refusals[name]
        assert f"LoRA adapter {name!r}" in message, message
        assert f"adapters/{name}" in message, message
        assert reason in message, message
        assert fix in message, message

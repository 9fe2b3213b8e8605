"""``tools/gpu_check.py --cpu``: every row of the GPU table at tiny sizes, its verdicts and arithmetic.

The GPU numbers themselves (tokens/s, MFU, peak memory, fla's parity) are only measured on a GPU
(docs/gpu.md). Here: the rows come in the issue's order, each printed as it finishes, the parity
verdict is the documented ratio, the training rows carry the Qwen3 ratio, MFU and the planner's
estimate, and a row that runs out of time or fails prints TIMEOUT / ERROR while the next row still runs.
"""

import json
import re
import time
from pathlib import Path

import gpu_check
import pytest
import torch

from llamafactory_zebra.kernels import FAKE_STACK_ENV_VAR, Stack  # noqa: E402
from llamafactory_zebra.planning.parameters import summarize  # noqa: E402


@pytest.fixture(autouse=True)
def _keep_backend_env(monkeypatch):
    monkeypatch.delenv(gpu_check.BACKEND_ENV_VAR, raising=False)
    monkeypatch.delenv(FAKE_STACK_ENV_VAR, raising=False)


def _rows(table: str) -> dict[str, list[str]]:
    return {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in table.splitlines()[2:]}


def test_cpu_table_has_every_row_in_order(capsys):
    table = gpu_check.main(["--cpu", "--peak-tflops", "1"])
    assert capsys.readouterr().out.strip() == table  # printed row by row, nothing else on stdout
    rows = _rows(table)
    kinds = [re.sub(r" \(.*", "", name) for name in rows]
    assert kinds == [
        "versions",
        "kernels",
        "kernels",
        "known issues",
        "parity chunk_gated_delta_rule",
        "parity fused_recurrent_gated_delta_rule",
        "parity causal_conv1d",
        "parity MLA layer",
        "packed sdpa",
        "train step 64 tokens",
        "train step 128 tokens",
        "train step 256 tokens",
        "decode step @ 32 context",
        "decode step @ 128 context",
    ]
    assert all(float(cells[-1].rstrip(" |")) >= 0 for cells in rows.values())  # every row timed
    assert rows["kernels (training)"][0] == "ok" and "GDN chunk: PyTorch chunked GDN" in rows["kernels (training)"][1]
    # sdpa on the samples' borders (per-sample sdpa on CPU) against the dense mask: fp32 rounding only.
    result, detail, _ = rows["packed sdpa (tiny, fp32, 4 samples in 130)"]
    loss_rel, grads_rel = float(result.split()[2].rstrip(",")), float(result.split()[5])
    assert loss_rel < 1e-6 and grads_rel < 1e-5 and "sdpa_per_segment" in detail
    for name, (result, detail, _) in rows.items():
        if name.startswith("parity"):
            # On CPU the fast path is the PyTorch path: the same bf16 computation, ratio exactly 1.
            assert result == "PASS: ratio 1.00 (<= 2)", name
            assert re.search(r"bf16 fast (\S+), bf16 PyTorch \1 vs fp32 PyTorch", detail), detail
    assert "forward + backward; H=2, K=32, V=64, 4 segments in 130" in table  # the tiny preset's GDN shape
    for name in ("train step 64 tokens (4 layers, vs Qwen3)", "train step 128 tokens (4 layers, vs Qwen3)"):
        result, detail, _ = rows[name]
        zebra, dense, ratio = re.fullmatch(
            r"Zebra ([\d,]+) tokens/s \(MFU [\d.]+%\) vs Qwen3 ([\d,]+) tokens/s \(MFU [\d.]+%\): ([\d.]+)x", result
        ).groups()
        assert float(ratio) == pytest.approx(int(zebra.replace(",", "")) / int(dense.replace(",", "")), rel=0.02)
        assert re.fullmatch(r"Zebra peak n/a on CPU, plan [\d.]+ MiB", detail)
    assert rows["train step 256 tokens (4 layers, Zebra alone)"][0].startswith("Zebra ")
    assert "vs Qwen3" not in rows["train step 256 tokens (4 layers, Zebra alone)"][0]
    decode = rows["decode step @ 128 context"][0]
    zebra_ms, dense_ms, ratio = map(
        float, re.fullmatch(r"Zebra ([\d.]+) ms vs Qwen3 ([\d.]+) ms per token \(([\d.]+)x\)", decode).groups()
    )
    assert ratio == pytest.approx(zebra_ms / dense_ms, rel=0.05)  # of the rounded printed times


def test_parity_verdict_is_the_error_ratio_against_the_bf16_pytorch_path():
    reference = [torch.ones(100), torch.ones(10)]
    own = [torch.ones(100) * 1.01, torch.ones(10) * 1.01]  # 1% off
    fast = [torch.ones(100) * 1.015, torch.ones(10) * 1.03]  # 1.5x and 3x that
    result, detail = gpu_check.parity_verdict(["a", "b"], fast, own, reference)
    assert result == "FAIL: ratio 3.00 (<= 2)" and detail.startswith(
        "worst b: bf16 fast 3.0e-02, bf16 PyTorch 1.0e-02"
    )
    result, _ = gpu_check.parity_verdict(["a"], fast[:1], own[:1], reference[:1])
    assert result == "PASS: ratio 1.50 (<= 2)"


def test_a_row_past_its_limit_or_failing_does_not_stop_the_next(capsys):
    report = gpu_check.Report("cpu", scale=1.0)
    report.run("slow row", 0.2, lambda: [time.sleep(0.01) for _ in range(1000)])
    report.run("broken row", 5, lambda: 1 / 0)
    report.run("good row", 5, lambda: [gpu_check.row("good row", "fine", "")])
    rows = _rows(report.table())
    assert rows["slow row"][0] == "TIMEOUT" and "0 s limit" in rows["slow row"][1]
    assert float(rows["slow row"][2].rstrip(" |")) < 5  # stopped by its alarm, not by finishing
    assert rows["broken row"][:2] == ["ERROR", "ZeroDivisionError: division by zero"]
    assert rows["good row"][0] == "fine"
    assert capsys.readouterr().out.splitlines()[-1].startswith("| good row | fine")


def test_mfu_counts_matmul_parameters_and_causal_attention():
    config = gpu_check.ZebraConfig.from_preset("tiny")
    zebra = gpu_check.build("zebra", config, "cpu", "sdpa")
    short, long = gpu_check.flops_per_token(zebra, 1000), gpu_check.flops_per_token(zebra, 2000)
    attention_per_1000 = 3 * config.num_attention_heads * (config.qk_head_dim + config.v_head_dim) * 1000
    assert long - short == pytest.approx(attention_per_1000 * config.layer_types.count("mla"))
    embeddings = config.vocab_size * config.hidden_size  # untied: the input embeddings are not multiplied
    assert short - attention_per_1000 == pytest.approx(6 * (summarize(config).total - embeddings))
    dense = gpu_check.build("qwen3", config, "cpu", "sdpa")
    assert dense.config.tie_word_embeddings and dense.config.hidden_size == config.hidden_size
    # Tied: the one matrix is the output head, counted once.
    assert gpu_check.matmul_parameters(dense) == sum(p.numel() for p in dense.parameters())


def test_a_blocked_stack_reports_the_issue_and_trains_on_the_pytorch_path(monkeypatch):
    fake = {
        "device": "cuda",
        "capability": [9, 0],
        "name": "NVIDIA H200",
        "versions": {"triton": "3.6.0", "fla-core": "0.6.0"},
    }
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, json.dumps(fake))
    stack = gpu_check.detect_stack()
    rows = _rows("\n\n" + "\n".join(gpu_check.format_row(r) for r in gpu_check.kernel_rows(stack)))
    assert rows["kernels (training)"][0] == "STOP: fla-hopper-triton-gated-bwd"
    assert rows["kernels (inference)"][0] == "ok"
    assert rows["known issues"][0].startswith("fla-hopper-triton-gated-bwd (training stops")
    assert gpu_check.kernel_rows(Stack("cpu"))[-1]["result"] == "none apply"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the real run would start")
def test_gpu_run_refuses_without_gpu():
    with pytest.raises(SystemExit, match="no CUDA/ROCm GPU"):
        gpu_check.main([])


def test_gpu_row_limits_fit_the_shell_timeout_with_room_for_start_up():
    shell = (Path(gpu_check.__file__).parent / "gpu_check.sh").read_text()
    (timeout,) = map(int, re.findall(r"timeout (\d+) python -u tools/gpu_check.py", shell))
    sizes, budgets = gpu_check.GPU, gpu_check.GPU.budgets
    rows = {"kernels": 1, "gdn chunk": 1, "gdn recurrent": 1, "conv": 1, "mla": 1, "packed sdpa": 1}
    rows |= {"train": len(sizes.train_lengths + sizes.zebra_only_lengths), "decode": len(sizes.decode_contexts)}
    assert set(rows) == set(budgets)
    total = sum(budgets[kind] * count for kind, count in rows.items())
    assert timeout == 480 and total <= timeout - 30  # imports and CUDA start-up come before the first row

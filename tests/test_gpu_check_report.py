"""``benchmarks/gpu_check.py`` on CPU: the table, the packed-step comparison and the planner's estimate.

The GPU numbers themselves (tokens/s, MFU, peak memory) are only measured on a GPU (docs/gpu.md).
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import gpu_check  # noqa: E402


@pytest.fixture(autouse=True)
def _keep_backend_env(monkeypatch):
    monkeypatch.delenv(gpu_check.BACKEND_ENV_VAR, raising=False)


def test_cpu_report_has_every_row(capsys):
    table = gpu_check.main(["--cpu", "--lengths", "48", "--models", "tiny", "--step-length", "64"])
    assert capsys.readouterr().out.strip() == table
    rows = {line.split("|")[1].strip(): line.split("|")[2:4] for line in table.splitlines()[2:]}
    assert list(rows) == [
        "versions",
        "kernel equality (fla vs PyTorch)",
        "packed step (tiny, bf16, 4 samples in 64)",
        "packed sdpa (tiny, fp32, 4 samples in 64)",
        "throughput tiny @ 48 tokens",
    ]
    assert "not run (no GPU)" in rows["kernel equality (fla vs PyTorch)"][0]
    # On CPU both sides of the packed step take the PyTorch backends: the comparison must be exact.
    assert rows["packed step (tiny, bf16, 4 samples in 64)"][0].split() == [
        "loss",
        "rel",
        "0.0e+00,",
        "grads",
        "rel",
        "0.0e+00",
    ]
    # sdpa on the samples' borders (per-sample sdpa on CPU) against the dense mask: fp32 rounding only.
    result, detail = rows["packed sdpa (tiny, fp32, 4 samples in 64)"]
    loss_rel, grads_rel = float(result.split()[2].rstrip(",")), float(result.split()[5])
    assert loss_rel < 1e-6 and grads_rel < 1e-5 and "sdpa_per_segment" in detail
    throughput, memory = rows["throughput tiny @ 48 tokens"]
    assert float(throughput.split()[0].replace(",", "")) > 0
    assert "plan" in memory and "n/a" in memory


def test_mfu_counts_parameters_and_causal_attention():
    config = gpu_check.model_config("tiny", "sdpa")
    short, long = gpu_check.flops_per_token(config, 1000), gpu_check.flops_per_token(config, 2000)
    attention_per_1000 = 3 * config.num_attention_heads * (config.qk_head_dim + config.v_head_dim) * 1000
    assert long - short == pytest.approx(attention_per_1000 * config.layer_types.count("mla"))
    embeddings = config.vocab_size * config.hidden_size
    assert short - attention_per_1000 == pytest.approx(6 * (gpu_check.summarize(config).total - embeddings))


@pytest.mark.skipif(gpu_check.torch.cuda.is_available(), reason="a GPU is visible: the real run would start")
def test_gpu_run_refuses_without_gpu():
    with pytest.raises(SystemExit, match="no CUDA/ROCm GPU"):
        gpu_check.main([])

"""fla's and Liger's Triton kernels, run by Triton's CPU interpreter through this package's dispatch.

One subprocess (``triton_interpreter/checks.py``; ``TRITON_INTERPRET=1`` must precede the first triton
import) runs every case with ``ZEBRA_GDN_BACKEND=fla`` / Liger's fused cross-entropy and again with
the PyTorch paths; the tests below assert, per case, that Triton kernels of the expected family ran
(and none on the PyTorch side), that both sides return the same shapes and dtypes, and that outputs,
final states and gradients agree:

- fp32: relative error ``||triton - pytorch|| / ||pytorch||`` below ``FP32_TOLERANCE``;
- bf16: below ``BF16_TOLERANCE`` (fla keeps the chunk states and tensor-core inputs in bf16, the
  PyTorch path computes in fp32).
"""

import json
import os
import subprocess
import sys

import pytest
from repo_paths import HELPERS, REPO

pytest.importorskip("fla", reason="fla (pip fla-core, in the `test` extra) is not installed")
pytest.importorskip("numpy", reason="Triton's interpreter needs numpy (in the `test` extra)")

FP32_TOLERANCE = 1e-4
BF16_TOLERANCE = 5e-2
# A_log and dt_bias get the sum over every token of the log-decay gradient, terms of both signs that
# largely cancel, so their relative error is ~5x that of the other gradients (fp32: 6e-6 vs 1e-6;
# bf16: 9e-2 vs <= 2e-2 measured).
DECAY_BF16_TOLERANCE = 0.15
KERNEL_FAMILY = {
    "chunk": "chunk_gated_delta_rule",
    "fused_recurrent": "fused_recurrent_gated_delta_rule",
    "conv": "causal_conv1d",
    "liger_cross_entropy": "liger_cross_entropy_kernel",
    "training_step": "chunk_gated_delta_rule",
}
# fp32 cases check the kernels' semantics tightly, bf16 cases the dtype contract and varlen borders;
# the training steps run every kernel the model uses in both dtypes (checks.py has more cases).
CASES = [
    "chunk_batch_fp32",
    "chunk_varlen_bf16",
    "fused_recurrent_varlen_bf16",
    "conv_varlen_bf16",
    "liger_cross_entropy_fp32",
    "training_step_fp32",
    "training_step_bf16",
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("triton_interpreter") / "results.json"
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HELPERS), str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "triton_interpreter.checks", str(out), *CASES],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    for case, result in results.items():  # shown with -s or -rA: the numbers docs/gpu.md quotes
        worst = max(result["errors"], key=result["errors"].get)
        print(f"{case}: worst {worst} {result['errors'][worst]:.1e} ({result['seconds']:.0f} s)")
    return results


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_triton_kernel_matches_pytorch_path(results, case):
    result = results[case]
    family = next(kernel for prefix, kernel in KERNEL_FAMILY.items() if case.startswith(prefix))
    assert any(family in name for name in result["kernels"]), f"no {family} kernel ran: {result['kernels']}"
    assert result["torch_kernels"] == {}, "the PyTorch side launched Triton kernels"
    if case.startswith("training_step"):
        assert any("liger_cross_entropy_kernel" in name for name in result["kernels"]), result["kernels"]
        assert any("causal_conv1d" in name for name in result["kernels"]), result["kernels"]
    for name, (triton_side, torch_side) in result["contract"].items():
        assert triton_side == torch_side, f"{name}: fla/Liger returned {triton_side}, PyTorch {torch_side}"
    assert result["errors"].keys() == result["contract"].keys()
    fp32 = case.endswith("fp32")
    for name, error in result["errors"].items():
        decay = name.endswith(("A_log", "dt_bias"))
        tolerance = FP32_TOLERANCE if fp32 else DECAY_BF16_TOLERANCE if decay else BF16_TOLERANCE
        assert error < tolerance, f"{name}: {error:.2e}"

"""The slot-indexed ops' fla branch (what a GPU runs), under Triton's CPU interpreter, against their PyTorch paths.

One subprocess (``triton_interpreter/slot_checks.py``) runs the decode step, the prompt-chunk op and the
conv ops on a state cache with ``ZEBRA_GDN_BACKEND=fla`` and again with ``torch``; fla's kernels must
have run on the fla side, none on the PyTorch side, and the outputs and whole caches (written and
untouched slots) must agree in fp32.
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
KERNEL_FAMILY = {
    "decode_in_slots_fp32": "fused_recurrent_gated_delta_rule",
    "prefill_in_slots_fp32": "chunk_gated_delta_rule",
    "conv_in_slots_fp32": "causal_conv1d",
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("slot_checks") / "results.json"
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HELPERS), str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "triton_interpreter.slot_checks", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(KERNEL_FAMILY))
def test_fla_branch_matches_pytorch_path_on_slots(results, case):
    result = results[case]
    assert any(KERNEL_FAMILY[case] in name for name in result["kernels"]), f"no fla kernel ran: {result['kernels']}"
    assert result["torch_kernels"] == {}, "the PyTorch side launched Triton kernels"
    for name, (fla_side, torch_side) in result["contract"].items():
        assert fla_side == torch_side, f"{name}: fla returned {fla_side}, PyTorch {torch_side}"
    assert result["errors"].keys() == result["contract"].keys()
    for name, error in result["errors"].items():
        assert error < FP32_TOLERANCE, f"{name}: {error:.2e}"

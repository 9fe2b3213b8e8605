"""bf16 on a CPU without bf16 dot products (issue 46): the one dtype rule (``kernels/run_dtype.py``), the known
issue it names (``cpu-bf16-without-dot-products``) in every phase of ``resolve()`` for a bf16 run only, doctor's
rows and fix, and LLaMA-Factory's entry points resolving for the dtype the run computes in — on described
machines (this test machine's own CPU may or may not have the instructions)."""

import json
import types

import pytest
import torch

from llamafactory_zebra.environment import checks as doctor
from llamafactory_zebra.kernels import FAKE_STACK_ENV_VAR, STOP, WARN, Stack, decider, resolve
from llamafactory_zebra.kernels.known_issues import CPU_BF16_EMULATED
from llamafactory_zebra.kernels.run_dtype import BF16, FP32, describe_rates, matmul_rates, run_dtype

NO_BF16_CPU = Stack("cpu", versions={"torch": "2.14.1"})  # an AVX2-only CPU: no AVX-512-BF16, AMX or Arm bf16
AMX_CPU = Stack("cpu", versions={"torch": "2.14.1"}, cpu_features=frozenset({"amx_tile", "avx512_bf16"}))
H200 = Stack("cuda", "NVIDIA H200", (9, 0), "sm_90", {"torch": "2.11.0"})


def test_auto_is_fp32_only_on_a_cpu_without_bf16_dot_products_and_a_named_dtype_wins():
    assert run_dtype("auto", NO_BF16_CPU) == FP32
    assert run_dtype("auto", AMX_CPU) == BF16 and run_dtype("auto", H200) == BF16
    assert run_dtype(BF16, NO_BF16_CPU) == BF16 and run_dtype(FP32, H200) == FP32
    with pytest.raises(ValueError, match="'fp16' is not valid; use auto, bfloat16 or float32"):
        run_dtype("fp16", NO_BF16_CPU)


def test_the_auto_rule_reads_a_faked_machine(monkeypatch):
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, json.dumps({"device": "cpu", "versions": {"torch": "2.14.1"}}))
    assert run_dtype() == FP32
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, json.dumps({"device": "cpu", "cpu_features": ["avx512_bf16"]}))
    assert run_dtype() == BF16


def test_the_matmul_probe_measures_both_dtypes():
    rates = matmul_rates((64, 32, 48), repeats=1)
    assert set(rates) == {BF16, FP32} and all(rate > 0 for rate in rates.values())
    line = describe_rates(rates, (64, 32, 48))
    assert line.startswith("CPU matmul 64x32 @ 32x48: bf16 ") and "bf16/fp32" in line


@pytest.mark.parametrize("phase", [{"training": True}, {"training": False}, {"training": False, "serving": True}])
def test_a_bf16_run_on_such_a_cpu_warns_with_the_fixes_in_every_phase_and_never_stops(phase):
    resolution = resolve(NO_BF16_CPU, **phase)
    (warning,) = [p for p in resolution.problems if p.key == CPU_BF16_EMULATED]
    assert warning.severity == WARN and resolution.with_severity(STOP) == []
    assert "docs/benchmarks.md" in warning.message and "pytorch/pytorch#146508" in warning.message
    assert any("--dtype float32" in fix for fix in warning.fixes)
    assert any("infer_dtype: float32" in fix for fix in warning.fixes)
    assert any("bf16: false" in fix for fix in warning.fixes)
    table = resolution.table()
    assert "WARN: a bf16 run on a CPU without bf16 dot products" in table and "fix: training: bf16: false" in table


@pytest.mark.parametrize(
    "stack, dtype", [(NO_BF16_CPU, torch.float32), (AMX_CPU, torch.bfloat16), (H200, torch.bfloat16)]
)
def test_no_row_for_fp32_a_cpu_with_the_instructions_or_a_gpu(stack, dtype):
    for training in (True, False):
        problems = resolve(stack, training=training, dtype=dtype).problems
        assert all(p.key != CPU_BF16_EMULATED for p in problems)


def test_doctor_names_it_with_the_fix_and_the_measured_rates(monkeypatch):
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, json.dumps({"device": "cpu", "versions": {"torch": "2.14.1"}}))
    serving = doctor.check_kernels(doctor.inspect_machine(), training=False, serving=True)
    assert serving.status == doctor.WARN and "a bf16 run on a CPU without bf16 dot products" in serving.detail
    assert "vllm serve ... --dtype float32" in serving.fix
    monkeypatch.setattr(doctor, "DOCTOR_PROBE_SHAPE", (64, 32, 48))
    machine = doctor.Machine("2.14.1", None, None, (), (), False, False, cpu_bf16_dot_products=False)
    bf16 = doctor.check_bf16(machine)
    assert bf16.status == doctor.WARN and CPU_BF16_EMULATED in bf16.detail and "GFLOP/s" in bf16.detail
    assert "infer_dtype: float32" in bf16.fix
    fine = doctor.check_bf16(doctor.Machine("2.14.1", None, None, (), (), False, False))
    assert fine.status == doctor.OK and "has bf16 dot products" in fine.detail and not fine.fix


def _model_args(infer_dtype="auto"):
    return types.SimpleNamespace(
        model_name_or_path="amd/HyLo-Qwen-7MLA21GDN-64K", flash_attn="auto", enable_liger_kernel=False,
        infer_dtype=infer_dtype,
    )  # fmt: skip


def test_the_entry_points_resolve_for_the_runs_dtype(monkeypatch):
    """LLaMA-Factory's ``infer_dtype: auto`` is fp32 on a CPU (no row); ``bfloat16`` is named before the model
    loads; a training run resolves for ``bf16``/``pure_bf16``."""
    from llamafactory_zebra.integration import kernel_choice

    monkeypatch.setattr(decider, "_emitted", set())
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, json.dumps({"device": "cpu", "versions": {"torch": "2.14.1"}}))
    auto = kernel_choice.resolve_for_run(_model_args(), training=False)
    assert all(p.key != CPU_BF16_EMULATED for p in auto.problems)
    asked = kernel_choice.resolve_for_run(_model_args(BF16), training=False)
    assert [p.key for p in asked.with_severity(WARN)] == [CPU_BF16_EMULATED]
    logged = []
    kernel_choice.log_resolution(asked, logged.append, logged.append)
    assert "a bf16 run on a CPU without bf16 dot products" in logged[-1]

    def training(bf16=False, pure_bf16=False):
        return kernel_choice.training_dtype(
            types.SimpleNamespace(bf16=bf16, fp16=False), types.SimpleNamespace(pure_bf16=pure_bf16)
        )

    assert training() == torch.float32 and training(bf16=True) == training(pure_bf16=True) == torch.bfloat16
    bf16_training = kernel_choice.resolve_for_run(_model_args(), training=True, dtype=training(bf16=True))
    assert [p.key for p in bf16_training.with_severity(WARN)] == [CPU_BF16_EMULATED]

"""The ROCm pitfalls as data (``kernels/known_issues.py``) and what the plugin does about them itself
(``kernels/workarounds.py``), under faked ROCm stacks: doctor and the training preflight name them as
applied, a multi-rank training run gets a Triton cache directory per rank before anything compiles."""

import json
import types

import pytest

from llamafactory_zebra.environment import checks as doctor
from llamafactory_zebra.kernels import FAKE_STACK_ENV_VAR, NOTE, STOP, WARN, Stack, decider, resolve
from llamafactory_zebra.kernels.known_issues import KNOWN_ISSUES, TRITON_CACHE_SHARED
from llamafactory_zebra.kernels.workarounds import fla_stage_cap, triton_cache_per_rank

AUTOTUNE = "fla-rocm-autotune-stages"
VERSIONS = {"torch": "2.10.0+rocm7.1", "pytorch-triton-rocm": "3.5.0", "fla-core": "0.6.0"}
MI300X = Stack("rocm", "AMD Instinct MI300X", (9, 4), "gfx942", VERSIONS, toolkit="ROCm 7.1")
FAKE_MI300X = json.dumps(
    {"device": "rocm", "capability": [9, 4], "arch": "gfx942", "name": "AMD Instinct MI300X", "versions": VERSIONS}
)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for variable in ("ZEBRA_FLA_MAX_STAGES", "ZEBRA_GDN_BACKEND", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(variable, raising=False)
    decider._select.cache_clear()


def test_every_issue_says_what_is_established_and_cites_its_source():
    for issue in KNOWN_ISSUES:
        assert issue.established and issue.upstream and issue.fixes, issue.key


def test_training_on_rocm_notes_both_workarounds_and_stops_nothing():
    resolution = resolve(MI300X, training=True)
    notes = {p.key: p for p in resolution.with_severity(NOTE)}
    assert set(notes) == {AUTOTUNE, TRITON_CACHE_SHARED}
    assert resolution.with_severity(STOP) == resolution.with_severity(WARN) == []
    assert "applied by the plugin" in notes[AUTOTUNE].message and "ZEBRA_FLA_MAX_STAGES=2" in notes[AUTOTUNE].fixes[0]
    # Not on NVIDIA, not without fla (the PyTorch path compiles no Triton kernel), not for inference.
    assert {
        p.key for p in resolve(Stack("cuda", "H100", (9, 0), "sm_90", VERSIONS), training=True).problems
    }.isdisjoint({AUTOTUNE, TRITON_CACHE_SHARED})
    without_fla = Stack("rocm", "AMD Instinct MI300X", (9, 4), "gfx942", {"pytorch-triton-rocm": "3.5.0"})
    assert AUTOTUNE not in {p.key for p in resolve(without_fla, training=True).problems}
    assert resolve(MI300X, training=False).with_severity(NOTE) == []


def test_doctor_names_the_workarounds_on_a_faked_mi300x(monkeypatch):
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, FAKE_MI300X)
    check = doctor.check_kernels(doctor.inspect_machine(), training=True)
    assert check.status == doctor.OK
    assert "NOTE: Triton's autotuning of fla kernels with num_stages >= 3" in check.detail
    assert "TRITON_CACHE_DIR" in check.detail


def test_the_stage_cap_applies_on_rocm_and_the_switch_widens_or_removes_it(monkeypatch):
    assert fla_stage_cap(MI300X) == (2, False)
    assert fla_stage_cap(Stack("cuda", "H100", (9, 0), "sm_90")) is None
    monkeypatch.setenv("ZEBRA_FLA_MAX_STAGES", "1")
    assert fla_stage_cap(Stack("cuda", "H100", (9, 0), "sm_90")) == (1, True)
    monkeypatch.setenv("ZEBRA_FLA_MAX_STAGES", "off")
    assert fla_stage_cap(MI300X) is None


def test_each_rank_of_a_rocm_run_gets_its_own_triton_cache(tmp_path):
    environ = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8", "TRITON_CACHE_DIR": str(tmp_path)}
    assert triton_cache_per_rank(MI300X, environ) == str(tmp_path / "rank_3")
    assert triton_cache_per_rank(MI300X, environ) == str(tmp_path / "rank_3")  # not rank_3/rank_3
    default = {"LOCAL_RANK": "0", "WORLD_SIZE": "2"}
    assert triton_cache_per_rank(MI300X, default).endswith("/.triton/cache/rank_0")
    for stack, environ in (
        (Stack("cuda", "H100", (9, 0), "sm_90"), {"LOCAL_RANK": "0", "WORLD_SIZE": "8"}),  # not ROCm
        (MI300X, {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}),  # one rank
        (MI300X, {}),  # not a torchrun worker
    ):
        assert triton_cache_per_rank(stack, environ) is None and "TRITON_CACHE_DIR" not in environ


def test_the_training_preflight_sets_the_cache_before_the_model_loads(monkeypatch, tmp_path):
    from training_runs import training_run

    from llamafactory_zebra.integration import kernel_choice

    monkeypatch.setenv(FAKE_STACK_ENV_VAR, FAKE_MI300X)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(decider, "_emitted", set())
    logged = []
    logger = types.SimpleNamespace(info_rank0=logged.append, warning_rank0=logged.append)
    model_args = types.SimpleNamespace(model_name_or_path="amd/HyLo-Qwen-7MLA21GDN-64K", flash_attn="auto",
                                       enable_liger_kernel=True)  # fmt: skip
    training = types.SimpleNamespace(use_cpu=False, bf16=True, fp16=False)
    finetuning = types.SimpleNamespace(pure_bf16=False)
    run = training_run(model_args, training=training, finetuning=finetuning, logger=logger)
    kernel_choice.training_kernel_step(run)
    import os

    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "rank_1")
    assert any(TRITON_CACHE_SHARED in line for line in logged)

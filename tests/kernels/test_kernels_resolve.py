"""Kernel resolution (``llamafactory_zebra/kernels``) on described machines: which kernel each part gets, the
known-broken fla/Triton/Hopper combination stopping training (not inference), and the entry points
that use it — doctor and ``llamafactory-cli train`` on a faked H200 in a subprocess."""

import json
import os
import subprocess
import sys
import types

import pytest
import torch
import yaml
from llamafactory_cli import BASE_ARGS

from llamafactory_zebra.environment import checks as doctor
from llamafactory_zebra.kernels import (
    BACKEND_ENV_VAR,
    FAKE_STACK_ENV_VAR,
    FLA_MISSING,
    KNOWN_ISSUES,
    NOTE,
    STOP,
    WARN,
    Stack,
    VersionRange,
    detect_stack,
    emit_once,
    parse_version,
    resolve,
    stack_from_json,
)
from llamafactory_zebra.kernels import decider as resolve_module
from llamafactory_zebra.kernels.registry import TORCH_GDN_GPU_COST

H200_TRITON_36 = {
    "device": "cuda",
    "capability": [9, 0],
    "name": "NVIDIA H200",
    "versions": {"torch": "2.11.0", "triton": "3.6.0", "fla-core": "0.6.0", "liger-kernel": "0.8.5"},
}
H200_NO_FLA = {**H200_TRITON_36, "versions": {"torch": "2.11.0", "triton": "3.6.0"}}
ISSUE = "fla-hopper-triton-gated-bwd"


def h200(**versions) -> Stack:
    return Stack("cuda", "NVIDIA H200", (9, 0), "sm_90", {**H200_TRITON_36["versions"], **versions})


@pytest.fixture(autouse=True)
def _auto_backend(monkeypatch):
    monkeypatch.delenv(BACKEND_ENV_VAR, raising=False)
    monkeypatch.delenv(FAKE_STACK_ENV_VAR, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_hopper_with_triton_36_stops_training_but_not_inference():
    training = resolve(h200(), training=True)
    assert training.choice("GDN chunk").family == "fla"
    (stop,) = training.with_severity(STOP)
    assert stop.key == ISSUE and "#640" in stop.message and "Hopper" in stop.message
    message = training.stop_message().splitlines()
    # The last lines are the fixes, numbered, the Triton upgrade first.
    assert message[-4] == "Fix one of:"
    assert (
        message[-3]
        == '  1. upgrade Triton: pip install "triton>=3.7.1" (or a torch >= 2.12.1, which ships Triton 3.7.1)'
    )
    assert "pip install tilelang" in message[-2]
    assert f"{BACKEND_ENV_VAR}=torch" in message[-1] and TORCH_GDN_GPU_COST in message[-1]
    inference = resolve(h200(), training=False)
    assert inference.with_severity(STOP) == [] and inference.with_severity(WARN) == []
    assert [p.key for p in inference.with_severity(NOTE)] == [ISSUE]
    assert inference.choice("GDN chunk").kernel == "fla chunk_gated_delta_rule"


@pytest.mark.parametrize(
    "stack",
    [
        h200(triton="3.7.1"),  # fixed Triton
        h200(triton="3.8.0"),
        h200(triton="3.3.1"),  # before the regression
        Stack("cuda", "NVIDIA A100", (8, 0), "sm_80", H200_TRITON_36["versions"]),  # not Hopper
        Stack("cuda", "NVIDIA B200", (10, 0), "sm_100", H200_TRITON_36["versions"]),
        Stack(
            "rocm", "AMD Instinct MI300X", (9, 4), "gfx942", H200_TRITON_36["versions"]
        ),  # capability 9.4, not NVIDIA
    ],
)
def test_outside_the_known_range_training_runs_on_fla(stack):
    resolution = resolve(stack, training=True)
    assert resolution.choice("GDN chunk").family == "fla"
    assert resolution.with_severity(STOP) == resolution.with_severity(WARN) == []
    assert all(p.key != ISSUE for p in resolution.problems)


def test_rocm_triton_is_read_from_its_own_distribution():
    versions = {"pytorch-triton-rocm": "3.6.0", "fla-core": "0.6.0"}
    assert Stack("rocm", "MI300X", (9, 4), "gfx942", versions).version("triton") == "3.6.0"


def test_tilelang_turns_the_stop_into_a_warning():
    resolution = resolve(h200(tilelang="0.1.15"), training=True)
    assert resolution.with_severity(STOP) == []
    (warning,) = resolution.with_severity(WARN)
    assert warning.key == ISSUE and "TileLang" in warning.message and "unverified" in warning.message


def test_torch_backend_accepts_the_pytorch_path(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV_VAR, "torch")
    resolution = resolve(h200(), training=True)
    assert resolution.problems == ()
    # the GPU-shaped formulation on a GPU
    assert resolution.choice("GDN chunk").kernel == "PyTorch chunked GDN (parallel)"
    inference = resolve(h200(), training=False)
    assert inference.choice("GDN recurrent").kernel == "PyTorch recurrent GDN"
    assert resolution.choice("conv").reason == f"{BACKEND_ENV_VAR}=torch"


def test_fla_missing_on_a_gpu_warns_with_the_install_command_and_the_measured_cost():
    for training in (True, False):
        resolution = resolve(Stack("cuda", "NVIDIA H200", (9, 0), "sm_90", {"triton": "3.6.0"}), training=training)
        assert resolution.choice("GDN chunk").family == "torch"
        (warning,) = resolution.problems
        assert warning.severity == WARN and warning.key == FLA_MISSING
        assert "pip install fla-core" in warning.message and TORCH_GDN_GPU_COST in warning.message


def test_forced_fla_without_fla_stops_every_phase(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV_VAR, "fla")
    for stack in (Stack("cpu", versions={}), Stack("cuda", "H200", (9, 0), "sm_90", {"triton": "3.6.0"})):
        for training in (True, False):
            (stop,) = resolve(stack, training=training).with_severity(STOP)
            assert f"{BACKEND_ENV_VAR}=fla" in stop.message


def test_forced_fla_under_the_triton_interpreter_runs_fla_on_cpu(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV_VAR, "fla")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    resolution = resolve(Stack("cpu", versions={"fla-core": "0.6.0", "triton": "3.8.0"}), training=True)
    assert resolution.choice("GDN chunk").family == "fla" and "interpreter" in resolution.choice("conv").reason


def test_cpu_uses_the_pytorch_paths_without_complaint():
    resolution = resolve(Stack("cpu", versions={"fla-core": "0.6.0", "liger-kernel": "0.8.5"}), training=True)
    assert resolution.problems == ()
    assert [(c.part, c.family) for c in resolution.choices] == [
        ("GDN chunk", "torch"),
        ("conv", "torch"),
        ("attention", "sdpa"),
        ("loss", "chunked"),
        ("distillation loss", "chunked"),
    ]


def test_attention_and_loss_rows():
    with_fa = resolve(
        h200(**{"flash-attn": "2.8.3"}, triton="3.7.1"), training=True, attn_implementation="flash_attention_2"
    )
    assert with_fa.choice("attention").kernel == "FlashAttention-2 varlen"
    assert with_fa.choice("loss").kernel == "Liger fused linear CE"
    without_fa = resolve(h200(triton="3.7.1"), training=True, attn_implementation="flash_attention_2")
    # Without flash-attn, packed rows on a GPU run sdpa on the samples' borders through flex_attention (the
    # attention policy), on CPU one sdpa call per sample; eager keeps the dense mask.
    attention = without_fa.choice("attention")
    assert attention.kernel == "sdpa (packed rows: flex_block_mask)" and "not installed" in attention.reason
    cpu = resolve(Stack("cpu", versions={}), training=True).choice("attention")
    assert cpu.kernel == "sdpa (packed rows: sdpa_per_segment)"
    eager = resolve(h200(), training=True, attn_implementation="eager").choice("attention")
    assert eager.kernel == "eager (packed rows: dense_mask)"
    no_liger = resolve(Stack("cuda", "H200", (9, 0), "sm_90", {}), training=True)
    assert no_liger.choice("loss").kernel == "chunked PyTorch CE"
    assert resolve(h200(), training=True, liger_enabled=False).choice("loss").family == "logits"
    assert "loss" not in {c.part for c in resolve(h200(), training=False).choices}


def test_version_ranges_and_parsing():
    assert parse_version("2.11.0+cu130") == (2, 11, 0) and parse_version("3.7.1rc1") == (3, 7, 1)
    with pytest.raises(ValueError, match="not a version"):
        parse_version("dev")
    triton = VersionRange("triton", "3.4.0", "3.7.1")
    assert [triton.contains(v) for v in ("3.3.1", "3.4.0", "3.6.0", "3.7.0", "3.7.1", None)] == [
        False,
        True,
        True,
        True,
        False,
        False,
    ]
    assert str(triton) == "triton >=3.4.0,<3.7.1" and VersionRange("fla-core").contains("0.1")
    assert {issue.key for issue in KNOWN_ISSUES} >= {ISSUE}


def test_fake_stack_from_the_environment_and_real_detection_without_it(monkeypatch):
    real = detect_stack()
    assert not real.faked
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, json.dumps(H200_TRITON_36))
    fake = detect_stack()
    assert fake.faked and fake.capability == (9, 0) and fake.arch == "sm_90" and fake.version("fla-core") == "0.6.0"
    assert fake.version("flash-attn") is None  # what the fake does not list is not installed
    monkeypatch.delenv(FAKE_STACK_ENV_VAR)
    assert detect_stack() == real
    with pytest.raises(ValueError, match=f"{FAKE_STACK_ENV_VAR} is not a valid machine description.*device"):
        stack_from_json('{"device": "tpu"}')
    with pytest.raises(ValueError, match=FAKE_STACK_ENV_VAR):
        stack_from_json("not json")


def test_emit_once_per_key(monkeypatch):
    monkeypatch.setattr(resolve_module, "_emitted", set())
    said = []
    assert emit_once("k", "first", said.append) and not emit_once("k", "again", said.append)
    assert emit_once("other", "second", said.append) and said == ["first", "second"]


def test_doctor_kernel_checks_on_a_faked_h200(monkeypatch):
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, json.dumps(H200_TRITON_36))
    training = doctor.check_kernels(doctor.inspect_machine(), training=True)
    assert training.status == doctor.FAIL and "#640" in training.detail and "NVIDIA H200" in training.detail
    assert training.fix.splitlines()[0].startswith('upgrade Triton: pip install "triton>=3.7.1"')
    inference = doctor.check_kernels(doctor.inspect_machine(), training=False)
    assert inference.status == doctor.OK and "not affected (forward only)" in inference.detail
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, json.dumps(H200_NO_FLA))
    for training in (True, False):
        check = doctor.check_kernels(doctor.inspect_machine(), training=training)
        assert check.status == doctor.WARN and "pip install fla-core" in check.detail
        assert "PyTorch chunked GDN" in check.detail


def _model_args(path="amd/HyLo-Qwen-7MLA21GDN-64K", flash_attn="auto", liger=True):
    return types.SimpleNamespace(model_name_or_path=path, flash_attn=flash_attn, enable_liger_kernel=liger)


def _training_run(model_args, logger, use_cpu=False):
    """The run object ``training.py`` hands its steps, with only what the kernel step reads."""
    from training_runs import training_run

    training = types.SimpleNamespace(use_cpu=use_cpu, bf16=not use_cpu, fp16=False)  # the recipe: bf16 on GPUs
    finetuning = types.SimpleNamespace(pure_bf16=False)
    return training_run(model_args, training=training, finetuning=finetuning, logger=logger)


def test_training_step_raises_with_the_fixes_last_and_logs_the_table_once(monkeypatch):
    from llamafactory_zebra.integration import kernel_choice

    monkeypatch.setattr(resolve_module, "_emitted", set())
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, json.dumps(H200_TRITON_36))
    logged = []
    logger = types.SimpleNamespace(info_rank0=logged.append, warning_rank0=logged.append)
    with pytest.raises(ValueError) as stopped:
        kernel_choice.training_kernel_step(_training_run(_model_args(), logger))
    assert str(stopped.value).splitlines()[-3].startswith('  1. upgrade Triton: pip install "triton>=3.7.1"')
    assert len(logged) == 1 and "kernels for training on NVIDIA H200" in logged[0]
    # use_cpu: true trains on the CPU whatever the GPU: nothing to stop; other models are left alone.
    kernel_choice.training_kernel_step(_training_run(_model_args(), logger, use_cpu=True))
    kernel_choice.training_kernel_step(_training_run(_model_args("Qwen/Qwen3-1.7B"), logger))
    assert len(logged) == 1  # the table is logged once per process and phase


SLOW_ENV = {"DISABLE_VERSION_CHECK": "1", "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_doctor_command_names_the_problem_and_the_triton_fix():
    env = {**os.environ, **SLOW_ENV, FAKE_STACK_ENV_VAR: json.dumps(H200_TRITON_36)}
    text = subprocess.run(
        [sys.executable, "-m", "llamafactory_zebra.cli.main", "doctor"], env=env, capture_output=True, text=True
    )
    assert text.returncode == 1, text.stderr[-2000:]
    training = text.stdout.split("kernels (training)", 1)[1].split("kernels (inference)", 1)[0]
    assert "fail" in training.splitlines()[0] and "faked by ZEBRA_FAKE_STACK" in training
    assert "chunk_bwd_dqkwg" in training and 'fix: upgrade Triton: pip install "triton>=3.7.1"' in training
    env[FAKE_STACK_ENV_VAR] = json.dumps(H200_NO_FLA)
    report = subprocess.run(
        [sys.executable, "-m", "llamafactory_zebra.cli.main", "doctor", "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    parsed = json.loads(report.stdout)
    checks = {c["name"]: c for c in parsed["checks"]}
    assert checks["kernels (training)"]["status"] == checks["kernels (inference)"]["status"] == "warn"
    kernels = {k["part"]: k["kernel"] for k in parsed["kernels"]["training"]["kernels"]}
    assert kernels["GDN chunk"] == "PyTorch chunked GDN (parallel)"
    (problem,) = parsed["kernels"]["training"]["problems"]
    assert problem["key"] == FLA_MISSING and "pip install fla-core" in problem["message"]


@pytest.mark.slow
def test_training_on_a_faked_h200_stops_before_the_model_loads(tmp_path, tiny_model_dir):
    config = tmp_path / "train.yaml"
    config.write_text(
        yaml.safe_dump({**BASE_ARGS, "model_name_or_path": str(tiny_model_dir), "output_dir": str(tmp_path / "out")})
    )
    env = {**os.environ, **SLOW_ENV, FAKE_STACK_ENV_VAR: json.dumps(H200_TRITON_36)}
    result = subprocess.run(
        ["llamafactory-cli", "train", str(config)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-4:]
    assert last[0] == "Fix one of:" and 'pip install "triton>=3.7.1"' in last[1], output[-3000:]
    assert "kernels for training on NVIDIA H200" in output  # the table was logged before the stop
    # Nothing of the model or the data was loaded: no parameter count, no tokenisation, no output.
    for after_load in ("trainable params", "all params", "Running tokenizer", "Converting format"):
        assert after_load not in output
    assert not (tmp_path / "out").exists()


def test_inference_entry_points_get_the_wrapped_parser_and_log_without_stopping(monkeypatch, tiny_model_dir):
    """chat/api (ChatModel), export and eval-long call ``get_infer_args``: the wrapper resolves for inference."""
    import importlib

    from llamafactory_zebra.seam import is_wrapped

    parser = importlib.import_module("llamafactory.hparams.parser")
    assert is_wrapped(parser, "get_infer_args")
    assert importlib.import_module("llamafactory.hparams").get_infer_args is parser.get_infer_args
    assert importlib.import_module("llamafactory.chat.chat_model").get_infer_args is parser.get_infer_args
    assert importlib.import_module("llamafactory.train.tuner").get_infer_args is parser.get_infer_args

    monkeypatch.setattr(resolve_module, "_emitted", set())
    logged = {"info": [], "warning": []}
    logger = types.SimpleNamespace(info_rank0=logged["info"].append, warning_rank0=logged["warning"].append)
    monkeypatch.setattr(parser, "logger", logger)
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, json.dumps(H200_TRITON_36))
    args = {"model_name_or_path": str(tiny_model_dir), "template": "zebra", "infer_dtype": "float32"}
    parser.get_infer_args(dict(args))  # the backward-only issue does not stop inference
    (table,) = logged["info"]
    assert "kernels for inference on NVIDIA H200" in table and "not affected (forward only)" in table
    assert logged["warning"] == []
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, json.dumps(H200_NO_FLA))
    monkeypatch.setattr(resolve_module, "_emitted", set())
    parser.get_infer_args(dict(args))
    parser.get_infer_args(dict(args))
    (warning,) = logged["warning"]  # once per process, however often the arguments are parsed
    assert "pip install fla-core" in warning and TORCH_GDN_GPU_COST in warning


def _fla_that_does_not_import_on_a_gpu_tensor(device: str) -> tuple[list[str], str, str, bool]:
    """Two calls on a (faked) GPU tensor, doctor's row after them, and a call on a CPU tensor."""
    from llamafactory_zebra.kernels import Call, Op, run
    from llamafactory_zebra.ops.backend import first_fla_module

    def fla_or_none(tensor):
        """What an op does: fla where the registry chose it, else its PyTorch path (None here)."""
        return run(Op.GDN_CHUNK, Call.of(tensor))

    def fla_or_nothing(kernel, point):
        return (lambda: first_fla_module(("fla.ops.gated_delta_rule",))) if kernel.key == "fla" else (lambda: None)

    resolve_module.implementation = fla_or_nothing  # in the forked child only

    warnings = []
    resolve_module.logger.warning = warnings.append
    gpu_tensor = torch.empty(2, device=device)
    results = [fla_or_none(gpu_tensor) for _ in range(2)]
    row = resolve(detect_stack(), training=False).choice("GDN chunk")
    cpu = fla_or_none(torch.empty(2, device="cpu"))
    return warnings, row.family, row.reason, results == [None, None] and cpu is None


def test_auto_on_a_gpu_tensor_whose_fla_does_not_import_warns_once_and_takes_pytorch(monkeypatch):
    """``ops/backend.py``: fla installed (per its metadata) but not importing falls back to PyTorch with one
    warning, and from then on the registry (``resolve`` included) says so. A faked CUDA tensor: no GPU here."""
    from test_kernel_matrix import on_the_machine

    from llamafactory_zebra.ops import backend

    monkeypatch.setattr(resolve_module, "_emitted", set())
    monkeypatch.setattr(resolve_module, "_unusable", {})
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, json.dumps(H200_TRITON_36))
    monkeypatch.setattr(backend, "fla_module", lambda module: None)
    resolve_module._select.cache_clear()
    gpu = Stack("cuda", "NVIDIA H200", (9, 0), "sm_90", H200_TRITON_36["versions"])
    warnings, family, reason, all_pytorch = on_the_machine(gpu, _fla_that_does_not_import_on_a_gpu_tensor)
    (warning,) = warnings
    assert "pip install fla-core" in warning and TORCH_GDN_GPU_COST in warning
    assert family == "torch" and "does not load here" in reason and all_pytorch

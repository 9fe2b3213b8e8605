"""``llamafactory-zebra doctor``: the real run on this GPU-less machine, and each rule on a described machine."""

import argparse
import json

import pytest

from llamafactory_zebra.cli import doctor_cmd as doctor_cli
from llamafactory_zebra.environment import checks as doctor
from llamafactory_zebra.environment.checks import FAIL, OK, WARN, Check, Machine
from llamafactory_zebra.environment.rocm_settings import rocm_env_file, rocm_settings
from llamafactory_zebra.kernels.registry import TORCH_GDN_GPU_COST

NO_GPU = Machine("2.9.0", None, "13.0", (), (), amd_gpus_present=False, nvidia_gpus_present=False)
MI300X = Machine("2.9.0", "6.4.0", None, ("AMD Instinct MI300X",) * 8, ("gfx942",) * 8, True, False)


@pytest.mark.slow  # the real checks start nvidia-smi/rocm-smi and a Python process
def test_doctor_json_on_this_machine(capsys):
    parser = argparse.ArgumentParser()
    doctor_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["doctor", "--json"])
    code = args.func(args)
    report = json.loads(capsys.readouterr().out)
    checks = {c["name"]: c for c in report["checks"]}
    assert set(checks) >= {
        "torch build",
        "GPUs",
        "bf16",
        "flash-attn",
        "fla (GDN kernels)",
        "Liger fused CE",
        "DeepSpeed",
        "RCCL/NCCL env",
        "torchrun",
        "version pins",
        "plugin active",
    }
    assert checks["GPUs"]["status"] == WARN and "no GPU" in checks["GPUs"]["detail"]
    assert all(c["status"] in (OK, WARN, FAIL) for c in report["checks"])
    # documented exit codes: 1 when any check fails, else 0 (a missing GPU only warns)
    any_failed = any(c["status"] == FAIL for c in report["checks"])
    assert code == report["exit_code"] == (1 if any_failed else 0)
    assert report["summary"] == {s: sum(c["status"] == s for c in report["checks"]) for s in (OK, WARN, FAIL)}


def test_exit_code_rule():
    assert doctor.exit_code([Check("a", OK, ""), Check("b", WARN, "")]) == 0
    assert doctor.exit_code([Check("a", OK, ""), Check("b", FAIL, "")]) == 1


def test_missing_gpu_warns_unless_required():
    assert doctor.check_gpus(NO_GPU, require_gpu=False).status == WARN
    assert doctor.check_gpus(NO_GPU, require_gpu=True).status == FAIL


def test_torch_build_must_match_the_gpus():
    cuda_torch_on_amd = Machine("2.9.0", None, "12.8", (), (), amd_gpus_present=True, nvidia_gpus_present=False)
    check = doctor.check_torch_build(cuda_torch_on_amd)
    assert check.status == FAIL and "rocm" in check.fix
    assert doctor.check_torch_build(MI300X).status == OK


def test_rocm_env_names_the_env_file(monkeypatch):
    for key in rocm_settings("gfx942"):
        monkeypatch.delenv(key, raising=False)
    check = doctor.check_collective_env(MI300X)
    assert check.status == WARN and "NCCL_MIN_NCHANNELS=112" in check.detail
    assert check.fix.endswith(f"{rocm_env_file('gfx942')}; set +a") and rocm_env_file("gfx942").is_file()
    for key, value in rocm_settings("gfx942").items():
        monkeypatch.setenv(key, value)
    assert "unset or different" not in doctor.check_collective_env(MI300X).detail


def test_disabled_plugin_fails_without_a_subprocess(monkeypatch):
    monkeypatch.setenv("LLAMAFACTORY_ZEBRA_DISABLE", "1")
    check = doctor.check_plugin(NO_GPU)
    assert check.status == FAIL and "LLAMAFACTORY_ZEBRA_DISABLE" in check.fix


@pytest.mark.parametrize("gpu_count", [0, 8])
def test_missing_fla_warns_with_the_install_command_and_the_measured_cost(monkeypatch, gpu_count):
    """Issue 27: fla missing on a GPU is one warning (the run trains, on the PyTorch path), never a failure."""

    def no_fla(name, *args, **kwargs):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(doctor.importlib, "import_module", no_fla)
    machine = MI300X if gpu_count else NO_GPU
    check = doctor.check_fla(machine)
    assert check.status == WARN and "pip install fla-core" in check.fix
    assert (TORCH_GDN_GPU_COST in check.detail) == bool(gpu_count)

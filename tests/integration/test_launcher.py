"""``llamafactory-cli train`` refuses a sequence-parallel size the torchrun world cannot hold before any worker
starts, in one line at the end of the output."""

import os
import subprocess
from types import ModuleType

import pytest
import yaml

from llamafactory_zebra.integration.launcher import launch_world_size, refusal

TORCHRUN_ENV = ("FORCE_TORCHRUN", "USE_MCA", "USE_RAY", "USE_KT", "NNODES", "NPROC_PER_NODE")


def fake_misc(devices: int) -> ModuleType:
    """A stand-in for ``llamafactory.extras.misc`` with the real environment rules and ``devices`` devices."""
    from llamafactory.extras import misc as real

    misc = ModuleType("llamafactory.extras.misc")
    misc.is_env_enabled, misc.use_ray, misc.use_kt = real.is_env_enabled, real.use_ray, real.use_kt
    misc.get_device_count = lambda: devices
    return misc


@pytest.fixture
def launch_env(monkeypatch):
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("env", "devices", "world"),
    [
        ({}, 0, 1),
        ({}, 1, 1),
        ({}, 4, 4),
        ({"NNODES": "2"}, 8, 16),
        ({"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2"}, 0, 2),
        ({"USE_RAY": "1"}, 4, None),
        ({"USE_RAY": "1", "FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "3"}, 4, 3),
        ({"USE_KT": "1"}, 4, 1),
    ],
)
def test_world_size_follows_llamafactorys_launch_rule(launch_env, env, devices, world):
    for name, value in env.items():
        launch_env.setenv(name, value)
    assert launch_world_size(fake_misc(devices)) == world


def write_config(tmp_path, tiny_model_dir, **values):
    config = tmp_path / "train.yaml"
    args = {"model_name_or_path": str(tiny_model_dir), "stage": "sft", "do_train": True, "output_dir": "out"}
    config.write_text(yaml.safe_dump({**args, **values}))
    return config


def test_the_launcher_names_the_key_its_value_and_the_valid_sizes(launch_env, tmp_path, tiny_model_dir):
    launch_env.setenv("FORCE_TORCHRUN", "1")
    launch_env.setenv("NPROC_PER_NODE", "4")
    misc = fake_misc(0)
    config = write_config(tmp_path, tiny_model_dir, sequence_parallel_size=3)
    assert refusal(["llamafactory-cli", "train", str(config)], misc) == (
        "llamafactory-zebra: sequence_parallel_size=3 does not divide the number of processes (4); use one of "
        "[1, 2, 4] or change the process count (NNODES=1 x NPROC_PER_NODE=4)"
    )
    # A command-line override counts as the workers would read it.
    assert refusal(["llamafactory-cli", "train", str(config), "sequence_parallel_size=2"], misc) is None
    malformed = write_config(tmp_path, tiny_model_dir, sequence_parallel_size="two")
    assert "sequence_parallel_size must be a positive integer, got 'two'" in refusal(
        ["llamafactory-cli", "train", str(malformed)], misc
    )


@pytest.mark.slow
def test_llamafactory_cli_refuses_before_torchrun_starts(tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir, sequence_parallel_size=3)
    env = {**os.environ, "FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2", "DISABLE_VERSION_CHECK": "1"}
    result = subprocess.run(
        ["llamafactory-cli", "train", str(config)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    output = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode == 1, output[-20:]
    assert output[-1] == (
        "llamafactory-zebra: sequence_parallel_size=3 does not divide the number of processes (2); use one of "
        "[1, 2] or change the process count (NNODES=1 x NPROC_PER_NODE=2)"
    )
    assert not any("distributed tasks" in line or "ChildFailedError" in line for line in output), output

"""Running LLaMA-Factory's own CLI on the tiny Zebra from tests: the SFT arguments the end-to-end tests
share, one ``llamafactory-cli`` call in a fresh process, and what its output directory logged."""

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import yaml
from repo_paths import REPO

BASE_ARGS = {
    "stage": "sft",
    "do_train": True,
    "dataset": "zebra_demo",
    "dataset_dir": str(REPO / "examples" / "data"),
    "template": "zebra",
    "cutoff_len": 128,
    "max_samples": 32,
    "packing": True,
    "neat_packing": True,
    "overwrite_cache": True,
    "preprocessing_num_workers": 1,
    "dataloader_num_workers": 0,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 1,
    "learning_rate": 5.0e-3,
    "lr_scheduler_type": "constant",
    "max_steps": 6,
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "bf16": False,
    "seed": 7,
    "enable_liger_kernel": True,
    "overwrite_output_dir": True,
}


def run_cli(command, args, tmp_path, env=None, timeout=600):
    config = tmp_path / f"{command}-{len(list(tmp_path.glob('*.yaml')))}.yaml"
    config.write_text(yaml.safe_dump(args))
    result = subprocess.run(
        ["llamafactory-cli", command, str(config)],
        cwd=tmp_path,
        env={**os.environ, "DISABLE_VERSION_CHECK": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result.stdout + result.stderr


def logged_losses(output_dir):
    lines = (Path(output_dir) / "trainer_log.jsonl").read_text().splitlines()
    return {entry["current_steps"]: entry["loss"] for entry in map(json.loads, lines) if "loss" in entry}


def assert_loss_falls(losses):
    steps = sorted(losses)
    assert len(steps) >= 5
    assert losses[steps[-1]] < losses[steps[0]] - 0.2, losses


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def two_ranks():
    return {"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2", "MASTER_PORT": str(free_port())}


def train_until_then_kill_rank_1(args, tmp_path, saved, env=None):
    """Start ``llamafactory-cli train`` on two ranks and ``kill -9`` its rank-1 worker as soon as every path in
    ``saved`` exists; the launcher must then fail."""
    import psutil

    config = tmp_path / "killed.yaml"
    config.write_text(yaml.safe_dump(args))
    env = {**os.environ, "DISABLE_VERSION_CHECK": "1", **two_ranks(), **(env or {})}
    output = tmp_path / "killed.log"  # a file, not a pipe: an unread pipe fills up and stalls the workers
    with output.open("w") as sink:
        launcher = subprocess.Popen(
            ["llamafactory-cli", "train", str(config)], cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.time() + 600
            while not all(path.exists() for path in saved):
                assert launcher.poll() is None and time.time() < deadline, output.read_text()[-3000:]
                time.sleep(0.1)
            workers = [
                p
                for p in psutil.Process(launcher.pid).children(recursive=True)
                if "launcher.py" in " ".join(p.cmdline())
            ]
            (rank_1,) = [p for p in workers if p.environ().get("LOCAL_RANK") == "1"]
            rank_1.kill()  # SIGKILL, as the OOM killer or a lost node would
            launcher.wait(timeout=300)
        finally:
            if launcher.poll() is None:
                for process in [*psutil.Process(launcher.pid).children(recursive=True), psutil.Process(launcher.pid)]:
                    process.kill()
    assert launcher.returncode != 0


def leave_a_partial_save(output_dir, last_complete, next_save):
    """What a kill during the save after ``checkpoint-<last_complete>`` leaves: ``checkpoint-<next_save>``
    without its trainer state or rank 1's RNG file (made from the last complete one if the kill came before
    that save started)."""
    partial = Path(output_dir) / f"checkpoint-{next_save}"
    if not partial.exists():
        shutil.copytree(Path(output_dir) / f"checkpoint-{last_complete}", partial)
        (partial / "rng_state_1.pth").unlink()
    (partial / "trainer_state.json").unlink(missing_ok=True)

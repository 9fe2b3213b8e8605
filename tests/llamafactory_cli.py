"""Running LLaMA-Factory's own CLI on the tiny Zebra from tests: the SFT arguments the end-to-end tests
share, one ``llamafactory-cli`` call in a fresh process, and what its output directory logged."""

import json
import os
import socket
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

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

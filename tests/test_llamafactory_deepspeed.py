"""LLaMA-Factory's multi-process training on the tiny Zebra: every shipped DeepSpeed preset on two CPU ranks
(gloo), unmodified, saves every weight; a ZeRO-3 run killed between saves resumes exactly.

Each run goes through the real CLI, so the import hook must activate the plugin in both torchrun workers.
"""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml
from llamafactory_cli import BASE_ARGS, REPO, free_port, logged_losses, run_cli
from safetensors.torch import load_file

pytestmark = pytest.mark.slow


def _preset_args(tiny_dir, out, preset, **overrides):
    return {
        **BASE_ARGS,
        "model_name_or_path": str(tiny_dir),
        "finetuning_type": "full",
        "output_dir": str(out),
        "deepspeed": str(REPO / "deepspeed_configs" / f"{preset}.json"),  # as shipped: bf16 "auto" -> fp32 here
        "per_device_train_batch_size": 1,
        "max_steps": 5,
        "ddp_timeout": 600,
        "tiled_mlp": preset == "ds_z3_bf16",
        **overrides,
    }


def _two_ranks():
    return {"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2", "MASTER_PORT": str(free_port())}


@pytest.fixture(scope="module")
def zero3_run(tiny_dir, tmp_path_factory):
    """One uninterrupted 2-rank ZeRO-3 run, saving every 2 steps: the preset check and the resume reference."""
    tmp_path = tmp_path_factory.mktemp("zero3")
    args = _preset_args(
        tiny_dir, tmp_path / "ds_z3_bf16", "ds_z3_bf16", max_steps=6, save_strategy="steps", save_steps=2
    )
    return args, run_cli("train", args, tmp_path, env=_two_ranks())


@pytest.mark.parametrize(
    "preset", ["ds_z3_bf16", "ds_z3_bf16_offload_optimizer", "ds_z3_bf16_offload_all", "ds_z2_bf16"]
)
def test_two_processes_with_each_deepspeed_preset_save_every_weight(tiny_dir, tmp_path, preset, request):
    """The "empty ZeRO-3 save" trap: the saved model must hold every weight, trained, and reload strictly.
    The preset is used unmodified with the YAML's ``bf16: false`` (CPU): its bf16 "auto" follows the YAML."""
    if preset == "ds_z3_bf16":
        args, log = request.getfixturevalue("zero3_run")
    else:
        args = _preset_args(tiny_dir, tmp_path / preset, preset)
        log = run_cli("train", args, tmp_path, env=_two_ranks())
    out = Path(args["output_dir"])
    assert ("MLPs run over sequence tiles" in log) == args["tiled_mlp"]
    for rank in (0, 1):
        assert f"llamafactory-zebra 0.1.0 active in rank {rank}" in log
    assert len(logged_losses(out)) == args["max_steps"]
    initial, saved = load_file(tiny_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert saved.keys() == initial.keys()
    for name, tensor in initial.items():
        assert saved[name].shape == tensor.shape and torch.isfinite(saved[name]).all(), name
    assert sum(not torch.equal(saved[n], initial[n]) for n in initial) > len(initial) // 2
    from llamafactory_zebra import ZebraForCausalLM

    ZebraForCausalLM.from_pretrained(out)  # strict: raises on any missing or unexpected weight


def _train_until_then_kill_rank_1(args, tmp_path, saved):
    """Start a 2-rank run and ``kill -9`` its rank-1 worker as soon as every path in ``saved`` exists."""
    import psutil

    config = tmp_path / "killed.yaml"
    config.write_text(yaml.safe_dump(args))
    env = {**os.environ, "DISABLE_VERSION_CHECK": "1", **_two_ranks()}
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


def test_zero3_run_killed_between_saves_resumes_with_the_uninterrupted_losses(zero3_run, tmp_path):
    """``kill -9`` of one rank after checkpoint-2; checkpoint-4, cut short, lacks its trainer state and rank 1's
    RNG file. Re-running the same YAML (LLaMA-Factory resumes an existing output_dir) must skip that partial
    save, resume from checkpoint-2 and log the uninterrupted run's losses, step for step (fp32 on CPU:
    |difference| <= 1e-5)."""
    reference_args, _ = zero3_run
    out = tmp_path / "killed"
    args = {**reference_args, "output_dir": str(out)}
    # Complete means both: rank 0 writes the trainer state, and rank 1 its RNG file, with no barrier between.
    complete = [out / "checkpoint-2" / name for name in ("trainer_state.json", "rng_state_0.pth", "rng_state_1.pth")]
    _train_until_then_kill_rank_1(args, tmp_path, complete)
    partial = out / "checkpoint-4"
    if not partial.exists():  # the kill came before the next save started: leave what a kill during it leaves
        shutil.copytree(out / "checkpoint-2", partial)
        (partial / "rng_state_1.pth").unlink()
    (partial / "trainer_state.json").unlink(missing_ok=True)
    assert not (out / "checkpoint-6").exists()

    log = run_cli("train", {**args, "overwrite_output_dir": False}, tmp_path, env=_two_ranks())
    assert f"resuming from {out / 'checkpoint-2'}, the last complete checkpoint" in log
    resumed, reference = logged_losses(out), logged_losses(reference_args["output_dir"])
    assert sorted(resumed) == sorted(reference) == list(range(1, 7))
    for step in range(3, 7):
        assert resumed[step] == pytest.approx(reference[step], abs=1e-5), (step, resumed, reference)
    assert (out / "checkpoint-6" / "trainer_state.json").exists()

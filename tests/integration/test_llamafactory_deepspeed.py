"""LLaMA-Factory's multi-process training on the tiny Zebra: every shipped DeepSpeed preset on two CPU ranks
(gloo), unmodified, saves every weight. (A 2-rank ZeRO-3 run killed between saves and resumed is in
``test_sp_llamafactory.py``.)

Each run goes through the real CLI, so the import hook must activate the plugin in both torchrun workers.
"""

from pathlib import Path

import pytest
import torch
from llamafactory_cli import BASE_ARGS, REPO, logged_losses, run_cli, two_ranks
from safetensors.torch import load_file

pytestmark = pytest.mark.slow


def _preset_args(tiny_model_dir_seed3, out, preset, **overrides):
    return {
        **BASE_ARGS,
        "model_name_or_path": str(tiny_model_dir_seed3),
        "finetuning_type": "full",
        "output_dir": str(out),
        "deepspeed": str(REPO / "deepspeed_configs" / f"{preset}.json"),  # as shipped: bf16 "auto" -> fp32 here
        "per_device_train_batch_size": 1,
        "max_steps": 5,
        "ddp_timeout": 600,
        "tiled_mlp": preset == "ds_z3_bf16",
        **overrides,
    }


@pytest.mark.parametrize(
    "preset", ["ds_z3_bf16", "ds_z3_bf16_offload_optimizer", "ds_z3_bf16_offload_all", "ds_z2_bf16"]
)
def test_two_processes_with_each_deepspeed_preset_save_every_weight(tiny_model_dir_seed3, tmp_path, preset):
    """The "empty ZeRO-3 save" trap: the saved model must hold every weight, trained, and reload strictly.
    The preset is used unmodified with the YAML's ``bf16: false`` (CPU): its bf16 "auto" follows the YAML."""
    args = _preset_args(tiny_model_dir_seed3, tmp_path / preset, preset)
    log = run_cli("train", args, tmp_path, env=two_ranks())
    out = Path(args["output_dir"])
    assert ("MLPs run over sequence tiles" in log) == args["tiled_mlp"]
    for rank in (0, 1):
        assert f"llamafactory-zebra 0.1.0 active in rank {rank}" in log
    assert len(logged_losses(out)) == args["max_steps"]
    initial, saved = load_file(tiny_model_dir_seed3 / "model.safetensors"), load_file(out / "model.safetensors")
    assert saved.keys() == initial.keys()
    for name, tensor in initial.items():
        assert saved[name].shape == tensor.shape and torch.isfinite(saved[name]).all(), name
    assert sum(not torch.equal(saved[n], initial[n]) for n in initial) > len(initial) // 2
    from llamafactory_zebra import ZebraForCausalLM

    ZebraForCausalLM.from_pretrained(out)  # strict: raises on any missing or unexpected weight

"""``tiled_mlp: true`` in ``llamafactory-cli train``: every Zebra MLP runs over sequence tiles.

LLaMA-Factory 0.9.5 has no such key (its parser rejects unknown keys), so it leaves the arguments
with the plugin's other keys before LLaMA-Factory parses them (``hparams.ZebraArguments``), the setup
is checked right after (:func:`check_tiled_mlp_setup`), and the SFT trainer wrapper tiles the model's
MLPs (:func:`tile_mlps`). The steps are called by ``training.py``'s one ``get_train_args`` wrapper; the
tiling itself is ``layers/tiled_mlp.py`` (DeepSpeed's ``TiledMLP``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from ..hparams import TrainingRun
from ..layers.tiled_mlp import AUTO, set_mlp_tiles
from ..released import checkpoint_layout

if TYPE_CHECKING:
    from llamafactory.extras.logging import _Logger


def tiled_mlp_step(run: TrainingRun) -> None:
    if run.zebra.tiled_mlp:
        check_tiled_mlp_setup(run)


def check_tiled_mlp_setup(run: TrainingRun) -> None:
    """Raise ``ValueError`` when the run's model is not a Zebra or plain DDP would run the tiles."""
    model_args, training_args = run.model, run.training
    if checkpoint_layout(model_args.model_name_or_path) is None:
        raise ValueError(
            f"tiled_mlp: true is implemented for Zebra models; {model_args.model_name_or_path} is not one"
        )
    if training_args.world_size > 1 and not training_args.deepspeed:
        raise ValueError(
            "tiled_mlp: true needs DeepSpeed (ZeRO-2/3) or a single process: under plain DDP every tile's "
            "backward would mark the MLP gradients ready again; add e.g. deepspeed: deepspeed_configs/ds_z3_bf16.json"
        )


def tile_mlps(model: nn.Module, logger: _Logger) -> None:
    """Tile every MLP of the model the SFT trainer is about to train (about one hidden size of tokens each)."""
    count = set_mlp_tiles(model, AUTO)
    logger.info_rank0(f"llamafactory-zebra: {count} MLPs run over sequence tiles (tiled_mlp)")

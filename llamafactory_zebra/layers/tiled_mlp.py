"""The MLP over sequence tiles, so a 1M-token layer never holds ``T × intermediate_size`` activations.

At 131,072 tokens per GPU the SwiGLU intermediates of one layer are 3 × 131,072 × 6144 values — the
largest single allocation of the 1M recipe's backward. DeepSpeed's ``TiledMLP`` (ALST) computes the
MLP tile by tile and recomputes each tile in backward; this module only decides the tile count and
keeps it safe: DeepSpeed marks ZeRO gradients ready after its last *requested* tile, so the count
passed is the number of chunks ``torch.chunk`` really produces.
"""

from __future__ import annotations

import math

import torch
from torch import nn

AUTO = 0


def tile_count(num_tokens: int, hidden_size: int, tiles: int) -> int:
    """Tiles actually produced for ``tiles`` requested (``AUTO``: about one hidden size of tokens each)."""
    requested = math.ceil(num_tokens / hidden_size) if tiles == AUTO else tiles
    requested = max(1, min(requested, num_tokens))
    return math.ceil(num_tokens / math.ceil(num_tokens / requested))


def tiled_mlp_forward(mlp: nn.Module, hidden_states: torch.Tensor, tiles: int) -> torch.Tensor:
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    count = tile_count(hidden_states.shape[-2], hidden_states.shape[-1], tiles)
    if count == 1:
        return mlp.dense_forward(hidden_states)
    return TiledMLP.apply(type(mlp).dense_forward, mlp, hidden_states, count, list(mlp.parameters()))


def set_mlp_tiles(model: nn.Module, tiles: int | None = AUTO) -> int:
    """Set the tile count of every Zebra MLP inside ``model`` (a PEFT wrapper too); returns how many."""
    if tiles is not None and tiles < 0:
        raise ValueError(f"tiles must be 0 (auto) or a positive count, got {tiles}")
    found = 0
    for module in model.modules():
        if hasattr(module, "dense_forward") and hasattr(module, "tiles"):
            module.tiles = tiles
            found += 1
    return found

"""GDN initialisation from a base attention layer by copying its projections (HyLo).

As HyLo (AMD) describes: K and V are repeated to the query heads (undoing GQA), then the overlapping
block of each attention projection is copied into the GDN one: ``q_proj``/``k_proj``/``v_proj`` take
the first ``min(gdn_dim, heads·head_dim)`` rows of W_Q / expanded W_K / expanded W_V, and ``o_proj``
the matching first columns of W_O (value channel ``c`` keeps its output column). Rows or columns the
base does not cover, and the parameters attention has no counterpart for (``a_proj``, ``b_proj``,
``g_proj``, the decay ``A_log``/``dt_bias``, the short convolutions, ``o_norm``), keep the
initialisation a freshly built Zebra model gives them. Qwen3's q/k norm weights are not carried
over: GDN L2-normalises q and k per head itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..configuration_zebra import ZebraConfig
from ..layers.gated_deltanet import ZebraGatedDeltaNet


def expand_kv_heads(weight: torch.Tensor, num_kv_heads: int, num_heads: int) -> torch.Tensor:
    """``[kv_heads·d, in]`` → ``[heads·d, in]``, each KV head repeated for the query heads that share it."""
    per_head = weight.view(num_kv_heads, -1, weight.shape[-1])
    return per_head.repeat_interleave(num_heads // num_kv_heads, dim=0).flatten(0, 1)


@dataclass
class GDNInit:
    weights: dict[str, torch.Tensor]
    # parameter name -> (slice kind, how many rows/columns came from the base, of how many)
    copied: dict[str, tuple[str, int, int]]


def fresh_gdn_weights(config: ZebraConfig, layer_idx: int, seed: int) -> dict[str, torch.Tensor]:
    """A GDN mixer initialised by ``ZebraPreTrainedModel._init_weights``, as in ``ZebraForCausalLM(config)``.

    Built on the meta device and materialised empty, so every parameter is drawn once (torch's own
    constructor init would draw it a second time); seeded per layer without touching the caller's RNG.
    """
    from ..modeling_zebra import ZebraPreTrainedModel

    with torch.device("meta"):
        module = ZebraGatedDeltaNet(config, layer_idx)
    module.to_empty(device="cpu")
    initialiser = ZebraPreTrainedModel(config)  # holds no layers; carries the config into _init_weights
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed * 100_003 + layer_idx)
        for submodule in module.modules():
            initialiser._init_weights(submodule)
    return dict(module.state_dict())


def init_gdn_from_attention(
    layer: dict[str, torch.Tensor],
    config: ZebraConfig,
    layer_idx: int,
    *,
    num_heads: int,
    num_kv_heads: int,
    seed: int = 0,
) -> GDNInit:
    weights = fresh_gdn_weights(config, layer_idx, seed)
    sources = {
        "q_proj.weight": layer["q"],
        "k_proj.weight": expand_kv_heads(layer["k"], num_kv_heads, num_heads),
        "v_proj.weight": expand_kv_heads(layer["v"], num_kv_heads, num_heads),
    }
    copied = {}
    for name, source in sources.items():
        target = weights[name]
        rows = min(target.shape[0], source.shape[0])
        target[:rows] = source[:rows].to(target.dtype)
        copied[name] = ("rows", rows, target.shape[0])
    target, source = weights["o_proj.weight"], layer["o"]
    columns = min(target.shape[1], source.shape[1])
    target[:, :columns] = source[:, :columns].to(target.dtype)
    copied["o_proj.weight"] = ("columns", columns, target.shape[1])
    return GDNInit(weights, copied)

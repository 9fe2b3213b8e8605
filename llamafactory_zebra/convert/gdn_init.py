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
from ..inventory import meta_gdn_mixer
from ..modeling_zebra import ZebraPreTrainedModel


def expand_kv_heads(weight: torch.Tensor, num_kv_heads: int, num_heads: int) -> torch.Tensor:
    """``[kv_heads·d, in]`` → ``[heads·d, in]``, each KV head repeated for the query heads that share it."""
    per_head = weight.view(num_kv_heads, -1, weight.shape[-1])
    return per_head.repeat_interleave(num_heads // num_kv_heads, dim=0).flatten(0, 1)


@dataclass
class GDNInit:
    weights: dict[str, torch.Tensor]
    # parameter name -> (slice kind, how many rows/columns came from the base, of how many)
    copied: dict[str, tuple[str, int, int]]


def init_gdn_from_attention(
    layer: dict[str, torch.Tensor],
    config: ZebraConfig,
    layer_idx: int,
    *,
    num_heads: int,
    num_kv_heads: int,
    seed: int = 0,
) -> GDNInit:
    """A GDN mixer initialised by ``ZebraPreTrainedModel._init_weights`` (as in ``ZebraForCausalLM(config)``),
    with the overlapping blocks of the attention projections copied in.

    Built on the meta device and materialised empty, so every parameter is drawn at most once (torch's own
    constructor init would draw it a second time), and only the rows or columns the base does not cover
    are drawn at all (what that saved a conversion: docs/benchmarks-history.md, "Converting a Qwen3
    checkpoint"); seeded per layer without touching the caller's RNG.
    """
    module = meta_gdn_mixer(config, layer_idx)
    module.to_empty(device="cpu")
    initialiser = ZebraPreTrainedModel(config)  # holds no layers; carries the config into _init_weights
    sources = {
        "q_proj": layer["q"],
        "k_proj": expand_kv_heads(layer["k"], num_kv_heads, num_heads),
        "v_proj": expand_kv_heads(layer["v"], num_kv_heads, num_heads),
        "o_proj": layer["o"].T,  # o_proj's columns are the value channels: copy them as rows of the transpose
    }
    copied = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed * 100_003 + layer_idx)
        for name, submodule in module.named_modules():
            if name not in sources:
                initialiser._init_weights(submodule)
        for name, source in sources.items():
            target = module.get_submodule(name).weight
            channels = target.T if name == "o_proj" else target
            count = min(channels.shape[0], source.shape[0])
            channels[:count] = source[:count].to(channels.dtype)
            if count < channels.shape[0]:
                channels[count:] = _fresh_linear_weight(initialiser, channels.shape[0] - count, channels.shape[1])
            copied[f"{name}.weight"] = ("columns" if name == "o_proj" else "rows", count, channels.shape[0])
    return GDNInit(dict(module.state_dict()), copied)


def _fresh_linear_weight(initialiser: torch.nn.Module, rows: int, columns: int) -> torch.Tensor:
    """``rows`` fresh rows of a linear weight, drawn by ``_init_weights`` as it draws a whole ``nn.Linear``
    (``skip_init``: torch's constructor would draw them once more)."""
    linear = torch.nn.utils.skip_init(torch.nn.Linear, columns, rows, bias=False)
    initialiser._init_weights(linear)
    return linear.weight.detach()

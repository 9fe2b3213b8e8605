"""Which linear layers bitsandbytes' 4-bit kernels cannot take, so a 4-bit load keeps them unquantised.

bitsandbytes' 4-bit CPU inference path repacks each quantised weight ``[out, in]`` into 32-row panels
and reshapes its scales per 64-element block of a row, so it asserts ``out % 32 == 0`` ("N must be
divisible by block_n") and fails on ``in % 64 != 0`` at the first generate, long after the load
succeeded. The ``tiny`` preset (48-wide MLA ranks, the quickstart's model) does not fit. Such layers are
few and small, so a 4-bit Zebra keeps them unquantised and says which when it loads:
``ZebraForCausalLM.__init__`` calls :func:`keep_unfit_linears_out_of_4bit` when the config asks for
bitsandbytes 4-bit (transformers sets ``config.quantization_config`` before it builds the model), which
adds them to the instance's ``_keep_in_fp32_modules``: the list transformers' bitsandbytes quantizers
leave alone (and keep in fp32 under an fp16 load). GDN's per-head gate projections would not fit either,
but the class's own ``_keep_in_fp32_modules`` keeps them out of every quantiser already, for their
precision: that one rule keeps them, and this one adds and names only the others.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

logger = logging.getLogger(__name__)

# bitsandbytes' 4-bit CPU kernel: output rows are packed 32 at a time (``block_n``), and its scales are
# reshaped per 64-element quantisation block of each row (``Linear4bit``'s default blocksize).
BNB_4BIT_OUT_MULTIPLE = 32
BNB_4BIT_IN_MULTIPLE = 64


def wants_bnb_4bit(quantization_config: Any) -> bool:
    """Whether a config's ``quantization_config`` (a ``BitsAndBytesConfig`` or its dict) asks for 4-bit."""
    if quantization_config is None:
        return False
    if isinstance(quantization_config, dict):
        return quantization_config.get("quant_method") == "bitsandbytes" and bool(
            quantization_config.get("load_in_4bit")
        )
    return getattr(quantization_config, "quant_method", None) == "bitsandbytes" and bool(
        getattr(quantization_config, "load_in_4bit", False)
    )


def bnb_4bit_unfit_linears(model: nn.Module) -> list[str]:
    """Names of the ``nn.Linear`` modules of ``model`` whose shape bitsandbytes' 4-bit kernel cannot take
    (the model may live on the meta device: only shapes are read)."""
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and (module.out_features % BNB_4BIT_OUT_MULTIPLE or module.in_features % BNB_4BIT_IN_MULTIPLE)
    ]


def keep_unfit_linears_out_of_4bit(model: nn.Module) -> list[str]:
    """Add :func:`bnb_4bit_unfit_linears` to ``model._keep_in_fp32_modules`` and log them, but for ``lm_head``
    (transformers never quantises it) and the modules the class keeps already (its patterns are name
    suffixes: the GDN gates); returns the names added."""
    kept = tuple(type(model)._keep_in_fp32_modules or ())
    unfit = [
        name
        for name in bnb_4bit_unfit_linears(model)
        if name != "lm_head" and not any(name.endswith(pattern) for pattern in kept)
    ]
    if unfit:
        model._keep_in_fp32_modules = set(model._keep_in_fp32_modules or ()) | set(unfit)
        logger.warning(
            "llamafactory-zebra: 4-bit: %d linear layers stay unquantised (bitsandbytes' 4-bit kernel needs "
            "out_features %% %d == 0 and in_features %% %d == 0): %s",
            len(unfit),
            BNB_4BIT_OUT_MULTIPLE,
            BNB_4BIT_IN_MULTIPLE,
            ", ".join(unfit),
        )
    return unfit

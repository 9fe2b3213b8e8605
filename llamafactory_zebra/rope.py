"""MLA's softmax scale, with DeepSeek's YaRN correction: the one home of the formula.

DeepSeek-V2/V3 (and Zebra's MLA after them) multiply the attention logits by ``qk_head_dim^-0.5`` and,
when ``rope_parameters`` is YaRN with ``mscale_all_dim``, by ``mscale(factor, mscale_all_dim)²`` with
``mscale(s, m) = 0.1 m ln(s) + 1`` (1 for ``s <= 1``). The training layer (``layers/mla.py``) and the
vLLM layer (``serving/vllm/mla.py``) both take their scale from :func:`mla_softmax_scale`.

Why not upstream's: transformers keeps ``yarn_get_mscale`` as a private helper inside each model file
that needs it (DeepSeek-V3, GLM-4-MoE-Lite, LongCat-Flash: one copy each), and vLLM in its own rotary
module, which the training side cannot import. The formula depends only on the config, so it lives
here, on the floor of the configuration, computed in Python floats (float64, ``math.log``): the same
value on every device and in every activation dtype.
"""

from __future__ import annotations

import math

from .configuration_zebra import ZebraConfig


def yarn_softmax_mscale(config: ZebraConfig) -> float:
    """DeepSeek's YaRN softmax correction ``mscale(factor, mscale_all_dim)²``; 1.0 without ``mscale_all_dim``."""
    rope = config.rope_parameters
    mscale_all_dim = rope.get("mscale_all_dim") if rope.get("rope_type") == "yarn" else None
    if not mscale_all_dim:
        return 1.0
    factor = float(rope["factor"])
    mscale = 1.0 if factor <= 1 else 0.1 * float(mscale_all_dim) * math.log(factor) + 1.0
    return mscale * mscale


def mla_softmax_scale(config: ZebraConfig) -> float:
    """What MLA multiplies ``q · k`` by: ``qk_head_dim^-0.5`` times :func:`yarn_softmax_mscale`."""
    return config.qk_head_dim**-0.5 * yarn_softmax_mscale(config)

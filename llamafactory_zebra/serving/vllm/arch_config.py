"""What vLLM's model config says of a Zebra's attention: the head size its expanded MLA layers really serve.

vLLM reads a model's head size from its config (``ModelConfig.get_head_size``, through the model-arch
convertor registered for its ``model_type``) and sizes hybrid blocks from it: one block's attention bytes
must cover one GDN state page (``Platform._align_hybrid_block_size``). ``ZebraConfig.head_dim`` is the rope
width (64, what transformers' RoPE helpers read), while an expanded MLA layer stores ``max(qk_head_dim,
v_head_dim)``-wide keys and values (``mla.py``), so vLLM counted half the bytes and then padded every GDN
page to the real attention page. The convertor below, registered in vLLM's own table for ``zebra``, reports
the served width. The latent layout's bytes come from its backend's ``customize_spec`` instead
(``latent_mla.py``), which vLLM's alignment asks first.
"""

from __future__ import annotations

import vllm.config  # noqa: F401  (first: the convertor module imported alone is a circular import in vLLM 0.32)
from vllm.transformers_utils.model_arch_config_convertor import (
    MODEL_ARCH_CONFIG_CONVERTORS,
    ModelArchConfigConvertorBase,
)

from ...configuration_zebra import ZebraConfig


def expanded_head_size(config: ZebraConfig) -> int:
    """The key/value width of an expanded MLA layer: queries/keys and values zero-padded to the wider one."""
    return max(config.qk_head_dim, config.v_head_dim)


class ZebraArchConfigConvertor(ModelArchConfigConvertorBase):
    def get_head_size(self) -> int:
        return expanded_head_size(self.hf_text_config)


def register_arch_config_convertor() -> None:
    MODEL_ARCH_CONFIG_CONVERTORS.setdefault(ZebraConfig.model_type, ZebraArchConfigConvertor)

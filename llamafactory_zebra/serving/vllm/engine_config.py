"""Engine settings the Zebra model needs, applied through vLLM's per-architecture config hook.

vLLM turns prefix caching on by default for hybrid models and then runs their state layers in
``mamba_cache_mode: align``: a request's GDN state then moves between per-block slots and the layer must
write checkpoints at block borders (vLLM's own GDN kernels do, through ``MambaPrefillCheckpointMetadata``).
The Zebra GDN layer (``gdn.py``) reads and writes one slot per request, so prefix caching is switched
off for it — a cached prefix would be served with the state of another position. vLLM's hook for such
per-architecture settings is ``MODELS_CONFIG_MAP`` (``vllm/model_executor/models/config.py``), which its
own models use the same way (e.g. Unlimited-OCR turns prefix caching off there).
"""

from __future__ import annotations

import logging

from vllm.model_executor.models.config import MODELS_CONFIG_MAP, VerifyAndUpdateConfig

logger = logging.getLogger(__name__)


class ZebraEngineConfig(VerifyAndUpdateConfig):
    @classmethod
    def verify_and_update_config(cls, vllm_config) -> None:
        cache_config = vllm_config.cache_config
        if cache_config.enable_prefix_caching:
            cache_config.enable_prefix_caching = False
            logger.warning(
                "Zebra: prefix caching is off (its GDN layers keep one state slot per request; "
                "vLLM's block-aligned state checkpoints are not implemented for them)"
            )


def register_engine_config(architecture: str) -> None:
    MODELS_CONFIG_MAP.setdefault(architecture, ZebraEngineConfig)

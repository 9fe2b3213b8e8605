"""What the plugin tells a ``vllm serve`` user when vLLM builds the Zebra, before the first request.

The known issues of this serving run (``kernels/known_issues.py``), resolved for the dtype vLLM serves in
and this machine — e.g. bf16 on a CPU without bf16 dot products, with ``--dtype float32`` as the fix — each
logged once as a warning (``kernels.emit_once``, shared with the ops); which of vLLM's model runners
serves (``runner.py``), with vLLM's reason; and the MLA cache layout (``mla.py``'s ``cache_layout``), why, and
its bytes per token and MLA layer (vLLM itself logs the block size and the GDN page padding it derives).
"""

from __future__ import annotations

from vllm.config import VllmConfig
from vllm.logger import init_logger

from ...configuration_zebra import MLA_NORM_QK_HEAD
from ...kernels import WARN, detect_stack, emit_once, resolve
from .arch_config import expanded_head_size
from .mla import LATENT, cache_layout, cache_values_per_token
from .runner import describe_runner

# Under vLLM's logger tree: vLLM configures only "vllm" and its children, so an info line elsewhere is never shown.
logger = init_logger("vllm.zebra")


def announce(vllm_config: VllmConfig) -> None:
    """Log the serving run's known issues with their fixes, the model runner and the MLA cache layout."""
    resolution = resolve(detect_stack(), training=False, serving=True, dtype=vllm_config.model_config.dtype)
    for problem in resolution.with_severity(WARN):
        fixes = "".join(f"\n  fix: {fix}" for fix in problem.fixes)
        emit_once(problem.key or problem.message, f"llamafactory-zebra: {problem.message}{fixes}", logger.warning)
    emit_once("vllm model runner", f"llamafactory-zebra: {describe_runner(vllm_config)}", logger.info)
    emit_once("mla cache layout", f"llamafactory-zebra: {describe_cache_layout(vllm_config)}", logger.info)


def describe_cache_layout(vllm_config: VllmConfig) -> str:
    config = vllm_config.model_config.hf_text_config
    layout, why = cache_layout(vllm_config)
    itemsize = vllm_config.model_config.dtype.itemsize
    values = cache_values_per_token(config, layout)
    if layout == LATENT:
        scales = config.mla_norm == MLA_NORM_QK_HEAD
        shape = f"{values} values (latent, rope key{', 1/rms per key head' if scales else ''})"
    else:
        shape = f"{values} values ({config.num_key_value_heads} key/value heads of {expanded_head_size(config)})"
    return f"MLA cache layout {layout} ({why}): {shape}, {values * itemsize:,} B per token and MLA layer"

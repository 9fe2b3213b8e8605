"""What the plugin tells a ``vllm serve`` user when vLLM builds the Zebra, before the first request.

The known issues of this serving run (``kernels/known_issues.py``), resolved for the dtype vLLM serves in
and this machine — e.g. bf16 on a CPU without bf16 dot products, with ``--dtype float32`` as the fix — each
logged once as a warning (``kernels.emit_once``, shared with the ops); and which of vLLM's model runners
serves (``runner.py``), with vLLM's reason.
"""

from __future__ import annotations

from vllm.config import VllmConfig
from vllm.logger import init_logger

from ...kernels import WARN, detect_stack, emit_once, resolve
from .runner import describe_runner

# Under vLLM's logger tree: vLLM configures only "vllm" and its children, so an info line elsewhere is never shown.
logger = init_logger("vllm.zebra")


def announce(vllm_config: VllmConfig) -> None:
    """Log the serving run's known issues with their fixes, and the model runner."""
    resolution = resolve(detect_stack(), training=False, serving=True, dtype=vllm_config.model_config.dtype)
    for problem in resolution.with_severity(WARN):
        fixes = "".join(f"\n  fix: {fix}" for fix in problem.fixes)
        emit_once(problem.key or problem.message, f"llamafactory-zebra: {problem.message}{fixes}", logger.warning)
    emit_once("vllm model runner", f"llamafactory-zebra: {describe_runner(vllm_config)}", logger.info)

"""Which of vLLM's model runners serves, and why: V1 (``v1/worker/cpu_model_runner.py``, ``gpu_model_runner.py``)
or Model Runner V2 (``v1/worker/gpu/``, on a CPU ``v1/worker/cpu/model_runner.py``).

vLLM 0.32 decides (``VllmConfig.use_v2_model_runner``): ``VLLM_USE_V2_MODEL_RUNNER`` when set, else V2 unless
Triton is unusable (``vllm.triton_utils.HAS_TRITON``) or the run asks for a feature V2 lacks. V2's input
preparation, sampling and hybrid-state bookkeeping are Triton kernels (97 in ``v1/worker/gpu/``), so on a CPU
it needs Triton's CPU backend: with the Triton wheel torch installs (no CPU backend), vLLM serves with V1 and
refuses a forced V2 when it builds its config (``Model Runner V2 requires Triton.``). The plugin's model works
under either: both hand the GDN layers the same ``GDNAttentionMetadata`` and copy its states with the
functions ``IsHybrid.get_mamba_state_copy_funcs`` derives from the model's ``get_mamba_state_copy_func``.
"""

from __future__ import annotations

from vllm import envs
from vllm.config import VllmConfig
from vllm.triton_utils import HAS_TRITON

V1, V2 = "V1", "V2"
ENV_VAR = "VLLM_USE_V2_MODEL_RUNNER"


def v2_refused() -> bool:
    """vLLM refuses Model Runner V2 in this process (``VllmConfig._validate_v2_model_runner``: no usable Triton)."""
    return not HAS_TRITON


def runner_choice(use_v2: bool | None = None) -> tuple[str, str]:
    """``(runner, why)``: ``use_v2`` is an engine's own answer (``VllmConfig.use_v2_model_runner``); None (no
    engine yet: ``doctor``) applies vLLM's rule for a run that asks for no feature only one runner has."""
    forced = envs.VLLM_USE_V2_MODEL_RUNNER
    if use_v2 is None:
        use_v2 = forced if forced is not None else HAS_TRITON
    if forced is not None:
        why = f"{ENV_VAR}={int(forced)}"
        if forced and v2_refused():
            why += ": vLLM refuses to start (Model Runner V2 requires Triton; none with a backend for this device)"
    elif use_v2:
        why = "vLLM's default"
    elif not HAS_TRITON:
        why = "vLLM's default falls back to V1: V2 needs Triton with a backend for this device (none here)"
    else:
        why = "vLLM's default falls back to V1 for a feature of this run that V2 lacks (vLLM's warning names it)"
    return (V2 if use_v2 else V1), why


def describe_runner(vllm_config: VllmConfig) -> str:
    runner, why = runner_choice(vllm_config.use_v2_model_runner)
    return f"vLLM's {runner} model runner serves the Zebra ({why})"

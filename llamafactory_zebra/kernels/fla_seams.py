"""The fla side of the seam door: the autotuned Triton kernels of Zebra's GDN path (fla 0.6.0), for the
ROCm workaround of ``known_issues.py`` (``fla-rocm-autotune-stages``).

Each :data:`FLA_SEAMS` record is one kernel as a module attribute (fla launches them by their module-global
name), with the SHA-256 of its source; ``tests/kernels/test_fla_seams.py`` checks them against the installed fla.
They are the kernels a forward and backward of Zebra's GDN layer launch (``chunk_gated_delta_rule`` with
``use_qk_l2norm_in_kernel``, ``causal_conv1d``), found by running one under Triton's CPU interpreter.
:func:`install_stage_cap` (called when an op first loads fla) replaces the rows that
``workarounds.fla_stage_cap`` names by a copy whose autotune configs run at most that many pipeline
stages — through :func:`~llamafactory_zebra.seam.wrap`, so :func:`~llamafactory_zebra.seam.original`
still gives fla's own. By default that is ROCm only, and only the two state-recurrence kernels (the rows
``on_import``): the kernels with runtime-length loops, the shape the hang was reported for. fla's own
config cache (``FLA_CACHE_MODE``, off by default) can hand back a stored config past the cap.
"""

from __future__ import annotations

import copy
import importlib
import logging
from types import ModuleType
from typing import Any

from ..seam import Seam, UpstreamSeamChanged, install, original
from .stack import detect_stack
from .workarounds import ROCM_STAGE_CAP, fla_stage_cap

logger = logging.getLogger(__name__)
HINT = "fla changed a kernel the ROCm workaround caps (kernels/fla_seams.py): re-read it and record its new hash"
# The state recurrences over chunks (runtime-length loops): capped on ROCm by default.
STATE_RECURRENCE = (
    "chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
    "chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64",
)


def capped_kernel(kernel: Any, max_stages: int) -> Any:
    """A copy of fla's autotuned ``kernel`` (an autotuner, or Triton heuristics over one) whose configs run
    at most ``max_stages`` pipeline stages: a config above runs at the cap, duplicates are dropped."""
    if hasattr(kernel, "configs"):
        capped = copy.copy(kernel)
        configs: dict[str, Any] = {}
        for config in kernel.configs:
            config = copy.copy(config)
            config.num_stages = min(config.num_stages, max_stages)
            configs.setdefault(str(config), config)
        capped.configs, capped.cache = list(configs.values()), {}
    elif hasattr(kernel, "fn"):
        capped = copy.copy(kernel)
        capped.fn = capped_kernel(kernel.fn, max_stages)
    else:
        raise UpstreamSeamChanged(f"{kernel!r} is not an autotuned Triton kernel any more; {HINT}")
    capped.__wrapped__ = kernel
    return capped


def _cap(attribute: str):
    def wrapper(module: ModuleType) -> Any:
        max_stages = (fla_stage_cap(detect_stack()) or (ROCM_STAGE_CAP, False))[0]
        return capped_kernel(original(module, attribute), max_stages)

    return wrapper


def _kernel(module: str, attribute: str, sha256: str) -> Seam:
    return Seam(
        module,
        attribute,
        source_sha256=sha256,
        wrapper=_cap(attribute),
        on_import=attribute in STATE_RECURRENCE,
        why="autotune at most N pipeline stages (known_issues: fla-rocm-autotune-stages)",
    )


FLA_SEAMS: tuple[Seam, ...] = (
    _kernel("fla.modules.causal_conv1d.ops", "causal_conv1d_fwd_kernel",
            "123762e006904eb8698bf8175d5b59c723040878b7019c13d342055d5cd3edac"),
    _kernel("fla.modules.causal_conv1d.ops", "causal_conv1d_bwd_kernel",
            "1604c5ef56e634ae8893360b5d3bb2a164ec0da21840ed5850300928bd299f9c"),
    _kernel("fla.modules.norm.l2norm", "l2norm_fwd_kernel",
            "d80f3c2c201d06ddb7ba4431d01184a18fb8ffabe6b124f40610123da1b60eca"),
    _kernel("fla.modules.norm.l2norm", "l2norm_bwd_kernel",
            "521f176d3a4d7801efa5758708e4e1823cef7762171742901418b0ca252c0425"),
    _kernel("fla.ops.utils.cumsum", "chunk_local_cumsum_scalar_kernel",
            "fca6c98630feab5c46283c30ed9b8c1bd75142c28e483d13347963c8820a6cc1"),
    _kernel("fla.ops.gated_delta_rule.chunk_fwd", "chunk_gated_delta_rule_fwd_kkt_solve_kernel",
            "2e909eab1f8abf7c4acd0beb7d7be4ea0b10ef9f48e98de21393901dcfee2cf4"),
    _kernel("fla.ops.gated_delta_rule.wy_fast", "recompute_w_u_fwd_kernel",
            "4e436711d6a9b055fd1842c56cf1f9432abbd8e7187e574ef5fa36872ff6241b"),
    _kernel("fla.ops.gated_delta_rule.wy_fast", "prepare_wy_repr_bwd_kernel",
            "80440699e38b578d5190b392270651e22de8c6fac604e84a7375c0695744bb7b"),
    _kernel("fla.ops.common.chunk_delta_h", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
            "3459ea8cb05112f77fe9bbe5c6bf4880d39110df757f637a5be4eb4098a58184"),
    _kernel("fla.ops.common.chunk_delta_h", "chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64",
            "96eb97a7fcff58e8b273ee367b5628a32de51ffb29edbebbfb4ec73cf775eb53"),
    _kernel("fla.ops.common.chunk_o", "chunk_fwd_kernel_o",
            "a9bf33baa3db2146b12b9d7f93565c1e2b95e527d3cb47638f889dd56d910b20"),
    _kernel("fla.ops.common.chunk_o", "chunk_bwd_kernel_dv_local",
            "3a1e54a406ab4eeac9767f9d7641decb502456321c50046783326d8c6f3ca0d4"),
    _kernel("fla.ops.common.chunk_o", "chunk_bwd_kernel_dqkwg",
            "65b3902e30d941436ec2432216069cf5d3551f36551ef189b6eea47cf4fe8800"),
)  # fmt: skip


def install_stage_cap() -> None:
    """Cap fla's autotuning where ``workarounds.fla_stage_cap`` says so (ROCm; ``ZEBRA_FLA_MAX_STAGES``).

    Idempotent; a kernel whose source drifted is still capped (the cap is safe on any autotuned kernel),
    with a warning naming it."""
    cap = fla_stage_cap(detect_stack())
    if cap is None:
        return
    every = cap[1]
    for name in dict.fromkeys(seam.module for seam in FLA_SEAMS):
        module = importlib.import_module(name)
        attributes = tuple(s.attribute for s in FLA_SEAMS if s.module == name) if every else None
        install(FLA_SEAMS, module, only=attributes, hint=HINT, warn=logger.warning)

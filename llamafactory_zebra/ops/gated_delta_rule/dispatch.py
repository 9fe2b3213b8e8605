"""Public gated-delta-rule entry points: fla's kernels on a GPU, this package's PyTorch code elsewhere.

Every implementation shares fla's contract, so a layer calls one function and never cares where it
runs. Which one runs for a call is the kernel registry's choice (``kernels/registry.py``, ops ``GDN
chunk`` and ``GDN recurrent``), made at each call from the inputs; this module binds each entry's function
(``kernels.bind``, at the end: fla's adapters and the compiled formulation are defined here, the PyTorch paths in
their modules). fla is always called with keyword arguments: its positional order differs between releases (e.g.
0.6 put ``gk`` after ``g`` in the fused recurrent op).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ...kernels import Call, Key, Op, bind, run
from ..backend import fla_function
from .checks import check_gdn_inputs
from .chunk import chunk_gated_delta_rule_torch
from .chunk_parallel import chunk_gated_delta_rule_parallel
from .fused_recurrent import fused_recurrent_gated_delta_rule_torch

_FLA_GDN = "fla.ops.gated_delta_rule"


def _fla(name: str) -> Callable:
    """fla's ``name`` with this package's signature: keywords only, ``cu_seqlens`` as int64."""

    def call(q, k, v, g, beta, *, cu_seqlens=None, **options):
        function = fla_function((_FLA_GDN,), name)
        fla_cu_seqlens = None if cu_seqlens is None else cu_seqlens.to(torch.int64)
        return function(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=fla_cu_seqlens, **options)

    call.__name__ = f"fla_{name}"
    return call


fla_chunk_gated_delta_rule = _fla("chunk_gated_delta_rule")
fla_fused_recurrent_gated_delta_rule = _fla("fused_recurrent_gated_delta_rule")
chunk_gated_delta_rule_parallel_compiled = functools.partial(chunk_gated_delta_rule_parallel, compile=True)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    *,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule over whole sequences (training / prefill), fla's layout and semantics.

    Args:
        q, k: ``[B, T, H, K]``. v: ``[B, T, H, V]``. One dtype for all three.
        g: ``[B, T, H]`` log-decay (<= 0), applied as ``S <- exp(g_t) S`` before token t writes.
        beta: ``[B, T, H]`` write strength (in [0, 1] for the Zebra layer).
        scale: multiplies q; defaults to ``K ** -0.5``.
        initial_state: ``[N, H, K, V]``, one row per sequence (N = B, or ``len(cu_seqlens) - 1``).
        output_final_state: also return the state after each sequence's last token.
        cu_seqlens: ``[N + 1]`` int32/int64 borders of packed sequences over T (B must be 1); no state
            crosses a border, each segment starts from its own ``initial_state`` row (or zeros).
        use_qk_l2norm_in_kernel: L2-normalise q and k (``x / sqrt(sum x^2 + 1e-6)``) first.

    Returns:
        ``o`` ``[B, T, H, V]`` in the input dtype and the final state ``[N, H, K, V]`` in fp32 (fp64 for
        fp64 inputs) or ``None``. Positional arguments stop after ``output_final_state``, where fla's
        and this signature's orders part ways.
    """
    return _dispatch(
        Op.GDN_CHUNK,
        (q, k, v, g, beta),
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    *,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token form of :func:`chunk_gated_delta_rule` (same contract) for decoding a few tokens.

    fla's kernel has no backward; the PyTorch path is differentiable.
    """
    return _dispatch(
        Op.GDN_RECURRENT,
        (q, k, v, g, beta),
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )


def _dispatch(op, inputs, *, cu_seqlens, **options):
    """Check once, then the registry's choice for these inputs."""
    q, k, v, g, beta = inputs
    check_gdn_inputs(q, k, v, g, beta, options["initial_state"], cu_seqlens)
    return run(op, Call.of(q), q, k, v, g, beta, cu_seqlens=cu_seqlens, **options)


bind(
    Op.GDN_CHUNK,
    {
        Key.FLA: fla_chunk_gated_delta_rule,
        Key.TORCH_PARALLEL_COMPILED: chunk_gated_delta_rule_parallel_compiled,
        Key.TORCH_PARALLEL: chunk_gated_delta_rule_parallel,
        Key.TORCH_CHUNK: chunk_gated_delta_rule_torch,
    },
)
bind(
    Op.GDN_RECURRENT,
    {Key.FLA: fla_fused_recurrent_gated_delta_rule, Key.TORCH: fused_recurrent_gated_delta_rule_torch},
)

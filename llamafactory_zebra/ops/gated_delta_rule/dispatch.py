"""Public gated-delta-rule entry points: fla's kernels on a GPU, this package's PyTorch code elsewhere.

Both paths share fla's contract, so a layer calls one function and never cares where it runs (which
PyTorch chunked formulation runs is decided in ``torch_path.py``). fla is always called with keyword
arguments: its positional order differs between releases (e.g. 0.6 put ``gk`` after ``g`` in the
fused recurrent op).
"""

from __future__ import annotations

import torch

from ..backend import fla_ops
from .checks import check_gdn_inputs
from .fused_recurrent import fused_recurrent_gated_delta_rule_torch
from .torch_path import torch_chunk_function

_FLA_GDN = "fla.ops.gated_delta_rule"


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
        "chunk_gated_delta_rule",
        lambda *args, **kwargs: torch_chunk_function(q)(*args, **kwargs),  # chosen after the input checks
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
        "fused_recurrent_gated_delta_rule",
        fused_recurrent_gated_delta_rule_torch,
        (q, k, v, g, beta),
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )


def _dispatch(fla_name, torch_function, inputs, *, cu_seqlens, **options):
    """Check once, then fla's kernel of that name on a GPU (keywords only), the PyTorch function elsewhere."""
    q, k, v, g, beta = inputs
    check_gdn_inputs(q, k, v, g, beta, options["initial_state"], cu_seqlens)
    fla = fla_ops(q, _FLA_GDN)
    if fla is not None:
        fla_cu_seqlens = None if cu_seqlens is None else cu_seqlens.to(torch.int64)
        return getattr(fla, fla_name)(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=fla_cu_seqlens, **options)
    return torch_function(q, k, v, g, beta, cu_seqlens=cu_seqlens, **options)

"""MLA initialisation from a base attention layer by truncated SVD (X-EcoMLA / Zebra-Llama).

Follows the recipe of AMD's X-EcoMLA and Zebra-Llama papers (Apache-2.0 code in AMD-AGI/AMD-Hybrid-Models):
``W_Q ≈ U_r (Σ_r V_rᵀ)`` gives ``q_b_proj = U_r`` and ``q_a_proj = Σ_r V_rᵀ``; the K rows that become
"nope" and all V rows, stacked per KV head in ``kv_b_proj``'s row order, are factorised by one joint
SVD into the latent half of ``kv_a_proj_with_mqa`` and ``kv_b_proj``; ``out_proj`` is ``o_proj``.

Rotary layout. The base rotates all ``head_dim`` dims in pairs ``(j, j + head_dim/2)`` at frequency
``θ^(-2j/head_dim)``; MLA rotates only ``qk_rope_head_dim`` dims, pair ``i`` at ``θ^(-2i/qk_rope)``.
With ``s = head_dim / qk_rope``, base pair ``j = s·i`` turns at exactly MLA pair ``i``'s frequency, so
those pairs become the MLA rope dims (placed interleaved ``(2i, 2i+1)`` or half-split ``(i, i + r/2)``
as the layer rotates them, same sign convention) and keep their rotation exactly; every other pair
becomes "nope" and loses its rotation — the first approximation. The same permutation is applied to
the rows of W_Q and W_K (and to Qwen3's q/k norm weights, which are per-dim and commute with it), so
every q·k product of the base is preserved except for the rotation of the nope dims.

Shared rope key. MLA has one rope key for all heads; it is the mean over the base's KV heads of the
rope rows of W_K — the released code's choice, and the least-squares best single matrix for all
heads. It is exact when the heads' rope rows agree (one KV head, for instance) — the second
approximation. Unlike the released code, the K rope rows are kept out of the joint SVD: the rank is
spent only on rows ``kv_b_proj`` represents, so the error the report gives is the Eckart–Young one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LowRankFactors:
    """``matrix ≈ up @ down`` at ``rank``, with the reconstruction error measured on the factors."""

    down: torch.Tensor
    up: torch.Tensor
    rank: int
    relative_error: float
    energy_kept: float


def truncated_svd(matrix: torch.Tensor, rank: int) -> LowRankFactors:
    """Best rank-``rank`` factors (Eckart–Young): ``down = Σ_r V_rᵀ`` ``[r, in]``, ``up = U_r`` ``[out, r]``.

    The leading singular vectors come from the eigendecomposition of the smaller Gram matrix (``M Mᵀ``,
    or ``Mᵀ M`` followed by a QR of ``M V_r``) — the same subspace as an SVD, several times faster on
    CPU (a 2048² SVD is most of a conversion's time) — and ``down = U_rᵀ M`` is the exact projection onto
    it. The relative error is measured on the factors — ``‖M − U_r U_rᵀ M‖² = ‖M‖² − ‖down‖²`` for
    orthonormal ``U_r`` (Pythagoras), which spares an ``out × in`` product — and the kept energy comes
    from the eigenvalues (σ²) over the Gram matrix's trace (``‖M‖²``), so the two are independent
    estimates of the same Eckart–Young number.
    """
    work = matrix.to(torch.float64 if matrix.dtype == torch.float64 else torch.float32)
    rows, cols = work.shape
    if rows <= cols:
        gram = work @ work.T
        energy, up = leading_eigenpairs(gram, rank)
    else:
        gram = work.T @ work
        energy, vectors = leading_eigenpairs(gram, rank)
        up = torch.linalg.qr(work @ vectors).Q
    down = up.T @ work
    tiny = torch.finfo(torch.float64).tiny
    total = gram.diagonal().double().sum().clamp_min(tiny)
    squared_norm = work.double().square().sum()
    lost = (squared_norm - down.double().square().sum()).clamp_min(0) / squared_norm.clamp_min(tiny)
    kept = energy.double().clamp_min(0).sum() / total
    return LowRankFactors(down, up, rank, float(lost.sqrt()), float(kept))


def leading_eigenpairs(symmetric: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``count`` largest eigenvalues of a symmetric matrix, descending, and their eigenvectors ``[n, count]``."""
    values, vectors = torch.linalg.eigh(symmetric)
    return values.flip(0)[:count], vectors.flip(-1)[:, :count].contiguous()


def head_dim_order(head_dim: int, rope_dim: int, interleave: bool) -> torch.Tensor:
    """Base head dims in MLA order: the nope dims (ascending), then the rope dims in the layer's layout."""
    step, half = head_dim // rope_dim, head_dim // 2
    firsts = [step * i for i in range(rope_dim // 2)]
    seconds = [j + half for j in firsts]
    rope = [d for pair in zip(firsts, seconds, strict=True) for d in pair] if interleave else firsts + seconds
    taken = set(rope)
    return torch.tensor([d for d in range(head_dim) if d not in taken] + rope)


def heads_view(weight: torch.Tensor, heads: int) -> torch.Tensor:
    return weight.view(heads, weight.shape[0] // heads, weight.shape[1])


@dataclass
class MLAInit:
    weights: dict[str, torch.Tensor]
    q: LowRankFactors
    kv: LowRankFactors
    rope_key_spread: float


def init_mla_from_attention(
    layer: dict[str, torch.Tensor],
    *,
    num_heads: int,
    num_kv_heads: int,
    mla_kv_heads: int,
    qk_rope_head_dim: int,
    q_lora_rank: int,
    kv_lora_rank: int,
    interleave: bool,
) -> MLAInit:
    """MLA weights (names relative to the ``mla`` module) from one base layer's q/k/v/o (and q/k norms).

    ``rope_key_spread`` is ``‖W_h − mean‖ / ‖W_h‖`` over the heads' rope rows: 0 when the shared rope key
    is exact.
    """
    q, k, v = layer["q"], layer["k"], layer["v"]
    head_dim = q.shape[0] // num_heads
    nope = head_dim - qk_rope_head_dim
    order = head_dim_order(head_dim, qk_rope_head_dim, interleave)
    q_rows = heads_view(q, num_heads)[:, order].reshape(q.shape)
    keys = heads_view(k, num_kv_heads)[:, order]
    values = heads_view(v, num_kv_heads)
    group = mla_kv_heads // num_kv_heads
    kv_rows = torch.cat((keys[:, :nope], values), dim=1).repeat_interleave(group, dim=0).flatten(0, 1)

    q_factors = truncated_svd(q_rows, q_lora_rank)
    kv_factors = truncated_svd(kv_rows, kv_lora_rank)
    rope_rows = keys[:, nope:].float()
    rope_key = rope_rows.mean(dim=0)
    spread = torch.linalg.matrix_norm(rope_rows - rope_key) / torch.linalg.matrix_norm(rope_rows).clamp_min(1e-30)

    weights = {
        "q_a_proj.weight": q_factors.down,
        "q_b_proj.weight": q_factors.up,
        "kv_a_proj_with_mqa.weight": torch.cat((kv_factors.down, rope_key.to(kv_factors.down.dtype))),
        "kv_b_proj.weight": kv_factors.up,
        "out_proj.weight": layer["o"],
    }
    if "q_norm" in layer:
        weights["q_norm.weight"] = layer["q_norm"][order]
        weights["k_norm.weight"] = layer["k_norm"][order]
    return MLAInit(weights, q_factors, kv_factors, float(spread.max()))

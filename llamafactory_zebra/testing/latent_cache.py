"""Random paged latent-MLA caches with known up-projections, for the latent attention tests, the GPU check
and the decode benchmark (``ops/latent_attention``).

A :class:`LatentProblem` holds, per request, the tokens' latents, rope keys and per-key-head scales as
plain tensors, the same rows scattered into a paged cache through a shuffled block table (the cache's
unused rows and row padding hold ``fill``, NaN by default, so a kernel that reads them shows it), and
explicit ``W_UK`` / ``W_UV`` / ``w_nope`` matrices: ``expand`` builds the keys and values Zebra's MLA
layer would (``layers/mla.py``'s ``ZebraMLA.expand``: ``[w_nope ⊙ W_UK c ; rope] · s`` and ``W_UV c``),
``absorb`` folds ``w_nope ⊙ W_UK`` into queries, ``unabsorb`` applies ``W_UV`` to a latent output. Only
torch, so both venvs can use it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LatentShapes:
    heads: int
    kv_heads: int
    latent_dim: int
    rope_dim: int
    nope_dim: int
    v_dim: int
    scaled: bool  # per-key-head scales in the row (mla_norm qk_head)
    padding: int = 0  # unused values at the end of each row

    @property
    def scales_offset(self) -> int | None:
        return self.latent_dim + self.rope_dim if self.scaled else None

    @property
    def row(self) -> int:
        return self.latent_dim + self.rope_dim + (self.kv_heads if self.scaled else 0) + self.padding


# The released 7MLA21GDN models' MLA layers (presets.py, configuration_zebra.py): 328 values a row.
RELEASED = LatentShapes(heads=16, kv_heads=8, latent_dim=256, rope_dim=64, nope_dim=64, v_dim=128, scaled=True)


# Small shapes for the kernel tests: GQA with and without scales and row padding, odd head counts, MQA.
SHAPES = {
    "gqa_scaled": LatentShapes(
        heads=6, kv_heads=3, latent_dim=24, rope_dim=8, nope_dim=12, v_dim=10, scaled=True, padding=3
    ),
    "mqa_odd_heads": LatentShapes(heads=5, kv_heads=1, latent_dim=17, rope_dim=6, nope_dim=7, v_dim=9, scaled=True),
    "gqa_unscaled": LatentShapes(
        heads=4, kv_heads=2, latent_dim=16, rope_dim=8, nope_dim=8, v_dim=12, scaled=False, padding=5
    ),
    "one_head": LatentShapes(heads=1, kv_heads=1, latent_dim=8, rope_dim=4, nope_dim=4, v_dim=4, scaled=True),
}
# Block size 16 with lengths on both sides of block borders, and a large block (vLLM's hybrid blocks are
# thousands of tokens) holding requests shorter and longer than one block.
LAYOUTS = {"block16": (16, [1, 15, 16, 17, 40]), "block528": (528, [1, 300, 529, 1100])}


@dataclass
class LatentProblem:
    shapes: LatentShapes
    lengths: list[int]
    block_size: int
    w_uk: torch.Tensor  # [kv, nope, R]
    w_uv: torch.Tensor  # [kv, v, R]
    w_nope: torch.Tensor  # [nope]: k_norm's nope weights for qk_head, ones otherwise
    latents: list[torch.Tensor]  # per request [S, R]
    ropes: list[torch.Tensor]  # per request [S, P]
    scales: list[torch.Tensor] | None  # per request [S, kv]
    cache: torch.Tensor  # [blocks, block_size, row]
    block_table: torch.Tensor  # [B, max_blocks] int32
    seq_lens: torch.Tensor  # [B] int32

    def expand(
        self, latent: torch.Tensor, rope: torch.Tensor, scales: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys ``[N, kv, nope + P]`` and values ``[N, kv, v]`` of ``N`` tokens, in ``latent``'s dtype."""
        w_uk, w_uv = self.w_uk.to(latent.dtype), self.w_uv.to(latent.dtype)
        key_nope = torch.einsum("knr,sr->skn", w_uk, latent) * self.w_nope.to(latent.dtype)
        keys = torch.cat((key_nope, rope[:, None].expand(-1, self.shapes.kv_heads, -1)), dim=-1)
        if scales is not None:
            keys = keys * scales[..., None]
        return keys, torch.einsum("kvr,sr->skv", w_uv, latent)

    def absorb(self, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[T, H, nope + P]`` queries → ``q_latent [T, H, R]`` and ``q_rope [T, H, P]``."""
        nope = self.shapes.nope_dim
        w_uk = self.w_uk.to(query.dtype).repeat_interleave(self.shapes.heads // self.shapes.kv_heads, dim=0)
        q_nope = query[..., :nope] * self.w_nope.to(query.dtype)
        return torch.einsum("thn,hnr->thr", q_nope, w_uk), query[..., nope:]

    def unabsorb(self, context: torch.Tensor) -> torch.Tensor:
        """Latent outputs ``[T, H, R]`` → ``[T, H, v]`` (``W_UV`` of each head's key head)."""
        w_uv = self.w_uv.to(context.dtype).repeat_interleave(self.shapes.heads // self.shapes.kv_heads, dim=0)
        return torch.einsum("thr,hvr->thv", context, w_uv)


def make_problem(
    shapes: LatentShapes,
    lengths: list[int],
    block_size: int,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    fill: float = float("nan"),
    device: str | torch.device = "cpu",
) -> LatentProblem:
    """Requests of ``lengths`` tokens in a paged cache of ``dtype``; the tokens' own tensors are ``dtype``
    too (what the cache holds, so references read the same rounded values)."""
    gen = torch.Generator().manual_seed(seed)
    s = shapes

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, dtype=torch.float64)

    w_uk = randn(s.kv_heads, s.nope_dim, s.latent_dim) / s.latent_dim**0.5
    w_uv = randn(s.kv_heads, s.v_dim, s.latent_dim) / s.latent_dim**0.5
    w_nope = 1 + 0.3 * randn(s.nope_dim) if s.scaled else torch.ones(s.nope_dim, dtype=torch.float64)
    latents, ropes, scales = [], [], []
    for length in lengths:
        # Token magnitudes spread over ~e^±1, so the per-token, per-head scales differ visibly.
        latent = randn(length, s.latent_dim) * (0.5 * randn(length, 1)).exp()
        rope = randn(length, s.rope_dim)
        key_nope = torch.einsum("knr,sr->skn", w_uk, latent)
        energy = key_nope.pow(2).sum(-1) + rope.pow(2).sum(-1, keepdim=True)
        scales.append(torch.rsqrt(energy / (s.nope_dim + s.rope_dim) + 1e-6))
        latents.append(latent)
        ropes.append(rope)
    per_request = [-(-length // block_size) for length in lengths]
    total = sum(per_request) + 2  # two blocks nobody owns
    order = torch.randperm(total, generator=gen)
    cache = torch.full((total, block_size, s.row), fill, dtype=torch.float64)
    width = max(per_request, default=0) + 1
    block_table = torch.full((len(lengths), width), int(order[-1]), dtype=torch.int32)
    used = 0
    for b, length in enumerate(lengths):
        blocks = order[used : used + per_request[b]]
        used += per_request[b]
        block_table[b, : len(blocks)] = blocks.int()
        row = torch.cat([latents[b], ropes[b], *([scales[b]] if s.scaled else [])], dim=-1)
        flat = cache[blocks].reshape(-1, s.row)
        flat[:length, : row.shape[1]] = row
        cache[blocks] = flat.view(len(blocks), block_size, s.row)

    def cast(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return [tensor.to(dtype).to(device) for tensor in tensors]

    return LatentProblem(
        shapes=s,
        lengths=list(lengths),
        block_size=block_size,
        w_uk=w_uk.to(device),
        w_uv=w_uv.to(device),
        w_nope=w_nope.to(device),
        latents=cast(latents),
        ropes=cast(ropes),
        scales=cast(scales) if s.scaled else None,
        cache=cache.to(dtype).to(device),
        block_table=block_table.to(device),
        seq_lens=torch.tensor(lengths, dtype=torch.int32, device=device),
    )

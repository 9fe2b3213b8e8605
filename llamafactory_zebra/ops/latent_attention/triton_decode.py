"""Absorbed latent decode on a GPU: a Triton split-K kernel over the paged latent cache, with Zebra's
per-key-head key scales.

The model is the grouped split-K decode vLLM's Triton MLA backend runs (``_fwd_grouped_kernel_stage1`` in
``vllm/v1/attention/ops/triton_decode_attention.py``, from SGLang/LightLLM), written here for this cache:

- stage 1 (:func:`_split_kernel`), grid ``(requests, head blocks, splits)``: each program takes up to 16
  query heads of one request (all heads read the same latent, so one program scores a ``[heads, tokens]``
  tile with one ``tl.dot``) and one of ``splits`` equal token ranges; it walks its range ``BLOCK_N`` tokens
  at a time through the block table, loads the latent ``[BLOCK_N, R]`` and rope key ``[BLOCK_N, P]`` of
  each row as two tiles (vLLM's kernel pads Zebra's ``R + P = 320`` to 512; two tiles waste nothing at the
  released 256 + 64), multiplies each score by the row's scale for the head's key head (``mla_norm:
  qk_head``; vLLM's kernels have no such scale), and keeps an online softmax. It writes the split's
  normalised latent sum and its log-sum-exp, fp32.
- stage 2 (:func:`_merge_kernel`), grid ``(requests, heads)``: merges the splits by their log-sum-exp.
  Small and key-agnostic, so the package's own rather than vLLM's private one (no vLLM import: it runs in
  both venvs and under ``TRITON_INTERPRET=1``).

The dot products ask for IEEE precision: fp32 caches get fp32 products (not TF32; ``ieee`` is also the
one precision every backend accepts), bf16/fp16 caches multiply in their dtype with fp32 accumulation,
as vLLM's kernel does (the softmax weights are rounded to the cache dtype for the second
product). Tested against ``reference.py`` under Triton's interpreter (``tests/ops/test_latent_attention_triton.py``)
and on a GPU by ``tools/gpu_check.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .layout import check_decode

BLOCK_N = 32  # tokens per loop step
MAX_BLOCK_H = 16  # query heads per program (tl.dot needs at least 16 rows)
# Splits aim at this many programs on the device in all (an H100 has 132 SMs), each split keeping at
# least MIN_SPLIT_TOKENS tokens so short requests are not cut into slivers.
TARGET_PROGRAMS = 256
MIN_SPLIT_TOKENS = 256


@triton.jit
def _block_scores(
    ql, qr, latent, cache, rows, mask_n, mask_h, mask_p, offs_p, kv_head, sm_scale,
    R: tl.constexpr, SCALES_OFFSET: tl.constexpr, HAS_SCALES: tl.constexpr,
):  # fmt: skip
    """``[BLOCK_H, BLOCK_N]`` scaled scores of the query heads against one block of cached rows: latent and rope
    dot products, times each token's scale for the head's key head (``qk_head``)."""
    rope = tl.load(cache + rows[:, None] + R + offs_p[None, :], mask=mask_n[:, None] & mask_p[None, :], other=0.0)
    qk = tl.dot(ql.to(latent.dtype), tl.trans(latent), input_precision="ieee")
    qk += tl.dot(qr.to(rope.dtype), tl.trans(rope), input_precision="ieee")
    if HAS_SCALES:
        scales = tl.load(
            cache + rows[None, :] + SCALES_OFFSET + kv_head[:, None], mask=mask_h[:, None] & mask_n[None, :], other=0.0
        )
        qk *= scales.to(tl.float32)
    return qk * sm_scale


@triton.jit
def _split_kernel(
    q_latent, q_rope, cache, block_table, seq_lens, mid, sm_scale,
    stride_ql_t, stride_ql_h, stride_qr_t, stride_qr_h, stride_page, stride_token, stride_bt,
    stride_mid_b, stride_mid_h, stride_mid_s,
    HEADS: tl.constexpr, GROUP: tl.constexpr, R: tl.constexpr, P: tl.constexpr, SCALES_OFFSET: tl.constexpr,
    HAS_SCALES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, SPLITS: tl.constexpr,
):  # fmt: skip
    request = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(2)
    mask_h = heads < HEADS
    offs_r = tl.arange(0, BLOCK_R)
    offs_p = tl.arange(0, BLOCK_P)
    mask_r = offs_r < R
    mask_p = offs_p < P

    length = tl.load(seq_lens + request)
    per_split = tl.cdiv(length, SPLITS)
    start = split * per_split
    end = tl.minimum(start + per_split, length)

    ql = tl.load(
        q_latent + request * stride_ql_t + heads[:, None] * stride_ql_h + offs_r[None, :],
        mask=mask_h[:, None] & mask_r[None, :],
        other=0.0,
    )
    qr = tl.load(
        q_rope + request * stride_qr_t + heads[:, None] * stride_qr_h + offs_p[None, :],
        mask=mask_h[:, None] & mask_p[None, :],
        other=0.0,
    )
    kv_head = heads // GROUP

    e_max = tl.zeros([BLOCK_H], dtype=tl.float32) - float("inf")
    e_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], dtype=tl.float32)
    for first in range(start, end, BLOCK_N):
        offs_n = first + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        page = tl.load(block_table + request * stride_bt + offs_n // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
        rows = page * stride_page + (offs_n % PAGE_SIZE).to(tl.int64) * stride_token  # [BLOCK_N]
        latent = tl.load(cache + rows[:, None] + offs_r[None, :], mask=mask_n[:, None] & mask_r[None, :], other=0.0)
        qk = _block_scores(ql, qr, latent, cache, rows, mask_n, mask_h, mask_p, offs_p, kv_head, sm_scale,
                           R, SCALES_OFFSET, HAS_SCALES)  # fmt: skip
        # Padded heads keep their zero scores (finite, never stored); tokens past the split get no weight.
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        new_max = tl.maximum(tl.max(qk, 1), e_max)
        correction = tl.exp(e_max - new_max)
        p = tl.exp(qk - new_max[:, None])
        acc = acc * correction[:, None] + tl.dot(p.to(latent.dtype), latent, input_precision="ieee")
        e_sum = e_sum * correction + tl.sum(p, 1)
        e_max = new_max

    # An empty split (a request shorter than its split count) leaves sum 0: output 0, log-sum-exp -inf.
    filled = e_sum > 0
    out = acc / tl.where(filled, e_sum, 1.0)[:, None]
    base = mid + request * stride_mid_b + heads * stride_mid_h + split * stride_mid_s
    tl.store(base[:, None] + offs_r[None, :], out, mask=mask_h[:, None] & mask_r[None, :])
    tl.store(base + R, tl.where(filled, e_max + tl.log(tl.where(filled, e_sum, 1.0)), float("-inf")), mask=mask_h)


@triton.jit
def _merge_kernel(
    mid,
    out,
    stride_mid_b,
    stride_mid_h,
    stride_mid_s,
    stride_out_t,
    stride_out_h,
    R: tl.constexpr,
    BLOCK_R: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    request = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_r = tl.arange(0, BLOCK_R)
    mask_s = offs_s < SPLITS
    base = mid + request * stride_mid_b + head * stride_mid_h + offs_s * stride_mid_s
    lse = tl.load(base + R, mask=mask_s, other=float("-inf"))
    weights = tl.exp(lse - tl.max(lse, 0))  # every request has a token, so some split is finite
    parts = tl.load(base[:, None] + offs_r[None, :], mask=mask_s[:, None] & (offs_r[None, :] < R), other=0.0)
    merged = tl.sum(parts * weights[:, None], 0) / tl.sum(weights, 0)
    tl.store(out + request * stride_out_t + head * stride_out_h + offs_r, merged, mask=offs_r < R)


def default_splits(requests: int, head_blocks: int, longest: int) -> int:
    """Splits per request: enough programs to fill the device, none shorter than ``MIN_SPLIT_TOKENS``."""
    wanted = triton.cdiv(TARGET_PROGRAMS, max(1, requests * head_blocks))
    return max(1, min(wanted, triton.cdiv(longest, MIN_SPLIT_TOKENS)))


def latent_decode_triton(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    kv_heads: int,
    scales_offset: int | None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """``[T, H, R]``, what ``reference.latent_decode_reference`` returns, from the two kernels above.

    ``num_splits`` fixes the token splits per request (:func:`default_splits` otherwise). The cache's rows
    must be contiguous within a row (``cache.stride(2) == 1``), as vLLM allocates them."""
    check_decode(q_latent, q_rope, cache, block_table, seq_lens, kv_heads, scales_offset)
    if cache.stride(2) != 1 or q_latent.stride(2) != 1 or q_rope.stride(2) != 1:
        raise ValueError("latent attention: cache, q_latent and q_rope need a unit stride in their last dimension")
    tokens, heads, latent_dim = q_latent.shape
    rope_dim = q_rope.shape[2]
    out = torch.empty_like(q_latent)
    if tokens == 0:
        return out
    block_h = min(MAX_BLOCK_H, max(16, triton.next_power_of_2(heads)))
    head_blocks = triton.cdiv(heads, block_h)
    splits = num_splits or default_splits(tokens, head_blocks, int(seq_lens.max()))
    mid = torch.empty(tokens, heads, splits, latent_dim + 1, dtype=torch.float32, device=q_latent.device)
    block_r = max(16, triton.next_power_of_2(latent_dim))
    _split_kernel[(tokens, head_blocks, splits)](
        q_latent,
        q_rope,
        cache,
        block_table,
        seq_lens,
        mid,
        scale,
        q_latent.stride(0),
        q_latent.stride(1),
        q_rope.stride(0),
        q_rope.stride(1),
        cache.stride(0),
        cache.stride(1),
        block_table.stride(0),
        mid.stride(0),
        mid.stride(1),
        mid.stride(2),
        HEADS=heads,
        GROUP=heads // kv_heads,
        R=latent_dim,
        P=rope_dim,
        SCALES_OFFSET=scales_offset or 0,
        HAS_SCALES=scales_offset is not None,
        BLOCK_R=block_r,
        BLOCK_P=max(16, triton.next_power_of_2(rope_dim)),
        BLOCK_H=block_h,
        BLOCK_N=BLOCK_N,
        PAGE_SIZE=cache.shape[1],
        SPLITS=splits,
    )
    _merge_kernel[(tokens, heads)](
        mid,
        out,
        mid.stride(0),
        mid.stride(1),
        mid.stride(2),
        out.stride(0),
        out.stride(1),
        R=latent_dim,
        BLOCK_R=block_r,
        SPLITS=splits,
        BLOCK_S=triton.next_power_of_2(splits),
    )
    return out

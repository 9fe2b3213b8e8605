"""The conversion plan: which layers become MLA or GDN, and the Zebra dimensions, checked up front.

Defaults reproduce the released Qwen3-1.7B 7MLA21GDN model and scale with the base (``docs/convert.md``):

- layers: one MLA per four layers, evenly spaced (``round(L / 4)``; 28 layers → 1, 5, 9, …, 25);
- MLA: ``qk_nope = qk_rope = head_dim / 2``, ``v_head_dim = head_dim``, the base's query and KV head
  counts, ``q_lora_rank = 21/32 · hidden`` rounded to a multiple of 64 (1344 for hidden 2048),
  ``kv_lora_rank = kv_heads · head_dim / 4`` (256 for 8 KV heads of 128);
- GDN: ``gdn_head_dim = 2 · head_dim`` (256), ``gdn_num_heads = round(0.75 · hidden / gdn_head_dim)``
  (6 for hidden 2048), ``expand_v = 2``, short convolutions of width 4.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..configuration_zebra import GDN, MLA
from .source import BaseShape, ConversionInputError

PLAN_PATTERN = re.compile(r"^(\d+)mla(\d+)gdn$", re.IGNORECASE)
SELECTIONS = ("uniform", "sensitivity")


@dataclass
class ConversionOptions:
    """What the user asked for; ``None`` means "the default rule for this base"."""

    plan: str | None = None
    mla_layers: list[int] | None = None
    num_mla: int | None = None
    select: str = "uniform"
    data: str | None = None
    score_tokens: int = 256
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    gdn_heads: int | None = None
    gdn_head_dim: int | None = None
    gdn_expand_v: int = 2
    gdn_conv_size: int = 4
    dtype: str | None = None
    allow_single_kind: bool = False
    seed: int = 0
    max_shard_bytes: int = 2 * 1024**3


@dataclass
class ZebraDims:
    """The dimensions of the converted model's mixers."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    gdn_num_heads: int
    gdn_head_dim: int
    gdn_expand_v: int
    gdn_conv_size: int


def uniform_mla_layers(num_layers: int, num_mla: int) -> list[int]:
    """Evenly spaced MLA layers: index ``ceil((k + ½)·L/N) − 1``; 7 of 28 → 1, 5, …, 25; 14 of 28 → 0, 2, …, 26."""
    return [math.ceil((k + 0.5) * num_layers / num_mla) - 1 for k in range(num_mla)]


def requested_num_mla(options: ConversionOptions, num_layers: int) -> int | None:
    """The MLA count implied by ``--plan``/``--num-mla`` (``None`` when explicit indices are given)."""
    asked = [name for name in ("plan", "mla_layers", "num_mla") if getattr(options, name) is not None]
    if len(asked) > 1:
        raise ConversionInputError(
            f"give one of --plan, --mla-layers, --num-mla (got {', '.join('--' + a.replace('_', '-') for a in asked)})"
        )
    if options.plan is not None:
        match = PLAN_PATTERN.match(options.plan.strip())
        if not match:
            raise ConversionInputError(f"--plan {options.plan!r}: expected the form <N>mla<M>gdn, e.g. 7mla21gdn")
        num_mla, num_gdn = int(match[1]), int(match[2])
        if num_mla + num_gdn != num_layers:
            example_mla = max(1, round(num_layers / 4))  # the released 1:3 MLA:GDN ratio
            raise ConversionInputError(
                f"--plan {options.plan}: {num_mla} + {num_gdn} = {num_mla + num_gdn} layers, but the base has "
                f"{num_layers} (e.g. --plan {example_mla}mla{num_layers - example_mla}gdn)"
            )
        return num_mla
    if options.mla_layers is not None:
        return None
    if options.num_mla is not None:
        if not 0 <= options.num_mla <= num_layers:
            raise ConversionInputError(
                f"--num-mla {options.num_mla}: must be between 0 and {num_layers} (the base's layers)"
            )
        return options.num_mla
    return max(1, round(num_layers / 4))


def check_layer_indices(indices: list[int], num_layers: int) -> list[int]:
    out_of_range = [i for i in indices if not 0 <= i < num_layers]
    if out_of_range:
        raise ConversionInputError(
            f"--mla-layers: indices {out_of_range} are out of range; the base has {num_layers} layers "
            f"(valid: 0..{num_layers - 1})"
        )
    duplicates = sorted({i for i in indices if indices.count(i) > 1})
    if duplicates:
        raise ConversionInputError(f"--mla-layers: indices {duplicates} are given more than once")
    return sorted(indices)


def check_both_kinds(layer_types: list[str], allow_single_kind: bool) -> None:
    if allow_single_kind:
        return
    for kind, flag in ((MLA, "MLA"), (GDN, "GDN")):
        if kind not in layer_types:
            raise ConversionInputError(
                f"the layer plan has no {flag} layers; a Zebra hybrid needs both kinds "
                "(pass --allow-single-kind for an all-MLA or all-GDN model)"
            )


def layer_types_from(mla_layers: list[int], num_layers: int) -> list[str]:
    chosen = set(mla_layers)
    return [MLA if i in chosen else GDN for i in range(num_layers)]


def resolve_dims(options: ConversionOptions, shape: BaseShape) -> ZebraDims:
    """Default dimensions for ``shape``, overridden by ``options``, checked against the base's matrices."""
    d, hidden = shape.head_dim, shape.hidden_size
    rope = options.qk_rope_head_dim or d // 2
    if rope <= 0 or rope % 2 or rope >= d or d % rope:
        raise ConversionInputError(
            f"--qk-rope-head-dim {rope}: must be even, smaller than the base head_dim {d} and divide it "
            f"(the MLA rope pairs are every {d}/{rope}-th rotary pair of the base; e.g. {d // 2})"
        )
    q_rank = options.q_lora_rank or max(64, round(hidden * 21 / 32 / 64) * 64)
    kv_rank = options.kv_lora_rank or max(16, shape.num_kv_heads * d // 4)
    q_full = min(hidden, shape.num_heads * d)
    kv_full = min(hidden, shape.num_kv_heads * (d - rope + d))
    if not 0 < q_rank <= q_full:
        raise ConversionInputError(
            f"--q-lora-rank {q_rank}: must be between 1 and {q_full}, the full rank of W_Q "
            f"(min(hidden {hidden}, heads {shape.num_heads} × head_dim {d}))"
        )
    if not 0 < kv_rank <= kv_full:
        raise ConversionInputError(
            f"--kv-lora-rank {kv_rank}: must be between 1 and {kv_full}, the full rank of [W_K nope rows; W_V] "
            f"(min(hidden {hidden}, kv_heads {shape.num_kv_heads} × (nope {d - rope} + v {d})))"
        )
    gdn_head_dim = options.gdn_head_dim or 2 * d
    gdn_heads = options.gdn_heads or max(1, round(0.75 * hidden / gdn_head_dim))
    for name, value in (
        ("--gdn-heads", gdn_heads),
        ("--gdn-head-dim", gdn_head_dim),
        ("--gdn-expand-v", options.gdn_expand_v),
    ):
        if value <= 0:
            raise ConversionInputError(f"{name} {value}: must be a positive integer")
    if options.gdn_conv_size < 2:
        raise ConversionInputError(f"--gdn-conv-size {options.gdn_conv_size}: must be at least 2")
    return ZebraDims(
        q_lora_rank=q_rank,
        kv_lora_rank=kv_rank,
        qk_nope_head_dim=d - rope,
        qk_rope_head_dim=rope,
        v_head_dim=d,
        gdn_num_heads=gdn_heads,
        gdn_head_dim=gdn_head_dim,
        gdn_expand_v=options.gdn_expand_v,
        gdn_conv_size=options.gdn_conv_size,
    )

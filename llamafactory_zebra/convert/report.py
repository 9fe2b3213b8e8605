"""The conversion report: per layer SVD errors and kept energy, and size/cache totals against the base."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..configuration_zebra import ZebraConfig
from .source import BaseShape

REPORT_NAME = "conversion_report.json"


@dataclass
class LayerReport:
    layer: int
    kind: str
    base_params: int
    params: int
    q_rank: int | None = None
    q_relative_error: float | None = None
    q_energy_kept: float | None = None
    kv_rank: int | None = None
    kv_relative_error: float | None = None
    kv_energy_kept: float | None = None
    rope_key_spread: float | None = None
    copied: dict[str, str] = field(default_factory=dict)


@dataclass
class ConversionReport:
    base: str
    base_family: str
    output: str
    dtype: str
    layer_types: list[str]
    layers: list[LayerReport]
    base_params: int
    params: int
    base_kv_bytes_per_token: int
    kv_bytes_per_token: int
    gdn_state_bytes_per_sequence: int
    approximations: list[str]
    seconds: float = 0.0

    def save(self, directory: Path) -> Path:
        path = directory / REPORT_NAME
        with open(path, "w", encoding="utf-8") as f:
            json.dump(asdict(self), f, indent=2)
        return path

    def table(self) -> str:
        def number(value, spec):
            return "-" if value is None else format(value, spec)

        header = (
            f"{'layer':>5} {'kind':<4} {'q rank':>6} {'q err':>7} {'q energy':>8} {'kv rank':>7} {'kv err':>7} "
            f"{'kv energy':>9} {'params':>12} {'base params':>12}"
        )
        lines = [header, "-" * len(header)]
        for row in self.layers:
            lines.append(
                f"{row.layer:>5} {row.kind:<4} {number(row.q_rank, 'd'):>6} {number(row.q_relative_error, '.4f'):>7} "
                f"{number(row.q_energy_kept, '.4f'):>8} {number(row.kv_rank, 'd'):>7} "
                f"{number(row.kv_relative_error, '.4f'):>7} {number(row.kv_energy_kept, '.4f'):>9} "
                f"{row.params:>12,} {row.base_params:>12,}"
            )
        ratio = self.kv_bytes_per_token / self.base_kv_bytes_per_token
        lines += [
            "",
            f"parameters: {self.params:,} (base {self.base_params:,}, {self.params / self.base_params:.3f}x)",
            f"KV cache per token: {self.kv_bytes_per_token:,} bytes (base {self.base_kv_bytes_per_token:,}, "
            f"{ratio:.1%}); GDN state per sequence: {self.gdn_state_bytes_per_sequence:,} bytes",
            "errors are relative Frobenius errors ||W - W_r|| / ||W|| of W_Q and of [W_K nope rows; W_V];",
            "energy is the share of sum(sigma^2) the kept singular values hold.",
        ]
        return "\n".join(lines)


def kv_bytes_per_token(config: ZebraConfig, itemsize: int) -> int:
    """MLA caches ``config.mla_cache_channels`` values per token; GDN layers cache nothing that grows."""
    return config.mla_cache_channels * len(config.mla_layers) * itemsize


def gdn_state_bytes(config: ZebraConfig, itemsize: int) -> int:
    """Recurrent state plus convolution windows of every GDN layer, per sequence."""
    key_dim = config.gdn_num_heads * config.gdn_head_dim
    value_dim = config.gdn_num_heads * config.gdn_head_v_dim
    per_layer = config.gdn_num_heads * config.gdn_head_dim * config.gdn_head_v_dim
    per_layer += (config.gdn_conv_size - 1) * (2 * key_dim + value_dim)
    return per_layer * itemsize * len(config.gdn_layers)


def base_kv_bytes_per_token(shape: BaseShape, itemsize: int) -> int:
    return shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * itemsize

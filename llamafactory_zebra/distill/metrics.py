"""The distillation loss parts a run logs: summed on the device per micro-batch, read once per log.

transformers' Trainer keeps its own ``tr_loss`` as a device tensor and converts it only when it logs;
the loss parts follow that rule, so a micro-batch never waits for a GPU→CPU copy (``.item()``).
"""

from __future__ import annotations

from typing import Any

import torch

# Logged distillation metrics: kd_loss, ce_loss, ild_loss_{layer}.
METRIC_PREFIXES = ("kd_loss", "ce_loss", "ild_loss_")
# Denominators, summed like the parts but not logged: target tokens (kd) or micro-batches (ild).
TOKENS, MICRO_BATCHES = "tokens", "micro_batches"


class LossParts:
    """Per-name sums since the last log, as detached float64 device tensors."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}

    def add(self, name: str, value: torch.Tensor) -> None:
        value = value.detach().to(torch.float64)
        self.sums[name] = self.sums[name] + value if name in self.sums else value

    def __bool__(self) -> bool:
        return bool(self.sums)

    def take(self, accelerator: Any, device: torch.device) -> dict[str, float]:
        """The logged values over the window and every rank (one all-reduce, one copy), then start over.

        kd parts are per target token (sum / tokens); ild parts per micro-batch (sum / micro-batches),
        ``ild_loss_{i}`` in layer order.
        """
        names = sorted(self.sums)
        local = torch.stack([self.sums[name].to(device) for name in names])
        totals = dict(zip(names, accelerator.reduce(local, reduction="sum").tolist(), strict=True))
        self.sums.clear()
        if TOKENS in totals:
            tokens = max(totals.pop(TOKENS), 1.0)
            return {name: round(value / tokens, 6) for name, value in totals.items()}
        batches = max(totals.pop(MICRO_BATCHES), 1.0)
        per_layer = {name: round(value / batches, 6) for name, value in totals.items()}
        return dict(sorted(per_layer.items(), key=lambda item: int(item[0].rsplit("_", 1)[1])))

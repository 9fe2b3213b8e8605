"""Writing a converted checkpoint shard by shard, in transformers' sharded-safetensors layout.

Tensors are buffered until a shard is full and then written, so at most one shard of the output is
in memory at any time. Shards get their final ``model-0000k-of-0000N`` names once the count is known;
a single shard is ``model.safetensors`` (no index), as ``save_pretrained`` would name it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"


class ShardedSafetensorsWriter:
    def __init__(self, output: Path, max_shard_bytes: int) -> None:
        self.output = output
        self.max_shard_bytes = max_shard_bytes
        self.buffer: dict[str, torch.Tensor] = {}
        self.buffer_bytes = 0
        self.shards: list[tuple[Path, list[str]]] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.buffer and self.buffer_bytes + size > self.max_shard_bytes:
            self.flush()
        self.buffer[name] = tensor.detach().contiguous()
        self.buffer_bytes += size
        self.total_bytes += size

    def flush(self) -> None:
        if not self.buffer:
            return
        path = self.output / f"model-part-{len(self.shards):05d}.safetensors"
        save_file(self.buffer, str(path), metadata={"format": "pt"})
        self.shards.append((path, list(self.buffer)))
        self.buffer, self.buffer_bytes = {}, 0

    def close(self) -> list[Path]:
        """Write the last shard, give every shard its final name and write the index when there are several."""
        self.flush()
        if len(self.shards) == 1:
            final = self.output / SAFE_WEIGHTS_NAME
            self.shards[0][0].replace(final)
            return [final]
        weight_map, paths = {}, []
        for number, (path, names) in enumerate(self.shards, start=1):
            final = self.output / f"model-{number:05d}-of-{len(self.shards):05d}.safetensors"
            path.replace(final)
            paths.append(final)
            weight_map.update(dict.fromkeys(names, final.name))
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
        with open(self.output / SAFE_WEIGHTS_INDEX_NAME, "w", encoding="utf-8") as f:
            json.dump(index, f, indent=2)
        return paths

"""Cut whole rows into the shards of a sequence-parallel group, after the steps that need whole rows.

Labels are shifted before cutting (the next-token target of a shard's last token lives on the next
rank), rows are padded to a multiple of the SP size (the padding is a separate sample: restarting
positions, attention mask 0, ignored labels, so real tokens are computed exactly as without it), and
the token count the loss divides by is taken over the whole rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..loss import IGNORE_INDEX
from .rank_groups import SequenceParallelLayout

ROW_KEYS = ("input_ids", "attention_mask", "position_ids", "labels", "shift_labels", "token_type_ids")


def _pad_rows(tensor: torch.Tensor, extra: int, value: int) -> torch.Tensor:
    return F.pad(tensor, (0, extra), value=value) if extra else tensor


def pad_rows_for_sequence_parallel(
    batch: dict[str, torch.Tensor], multiple: int, pad_token_id: int = 0
) -> dict[str, torch.Tensor]:
    """Add ``shift_labels`` (from ``labels`` unless present) and ``position_ids`` (0… per row unless
    present), then pad every ``[B, T]`` entry to a multiple of ``multiple`` tokens."""
    if "input_ids" not in batch:
        raise ValueError(f"a sequence-parallel batch needs input_ids, got keys {sorted(batch)}")
    out = dict(batch)
    input_ids = out["input_ids"]
    rows, length = input_ids.shape
    if "position_ids" not in out:
        out["position_ids"] = torch.arange(length, device=input_ids.device).expand(rows, -1)
    if "labels" in out and "shift_labels" not in out:
        out["shift_labels"] = F.pad(out["labels"][:, 1:], (0, 1), value=IGNORE_INDEX)
    extra = -length % multiple
    pad_positions = torch.arange(extra, device=input_ids.device).expand(rows, -1)
    for key in ROW_KEYS:
        if key not in out:
            continue
        if tuple(out[key].shape) != (rows, length):
            raise ValueError(f"batch[{key!r}] has shape {tuple(out[key].shape)}, expected [B, T] = {(rows, length)}")
        if key == "position_ids":
            out[key] = torch.cat([out[key], pad_positions.to(out[key].dtype)], dim=1) if extra else out[key]
        else:
            value = {"input_ids": pad_token_id, "labels": IGNORE_INDEX, "shift_labels": IGNORE_INDEX}.get(key, 0)
            out[key] = _pad_rows(out[key], extra, value)
    return out


def shard_batch(
    batch: dict[str, torch.Tensor], layout: SequenceParallelLayout, pad_token_id: int = 0
) -> dict[str, torch.Tensor]:
    """This rank's shard of a whole-row batch (every rank of the SP group passes the same batch).

    Adds ``num_items_in_batch`` = (target tokens in the whole rows) / SP size: the model's loss is then
    ``SP x`` (this shard's loss sum) / (the group's target tokens), whose sum over the group is SP times
    the token-weighted mean. Frameworks that average gradients over all ``dp x sp`` ranks (DeepSpeed
    with ``mpu``, DDP) thereby get exactly the per-group token-weighted mean, averaged over DP groups.
    """
    padded = pad_rows_for_sequence_parallel(batch, layout.size, pad_token_id)
    piece = layout.shard(padded["input_ids"].shape[1])
    out = {key: (value[:, piece].contiguous() if key in ROW_KEYS else value) for key, value in padded.items()}
    if "shift_labels" in padded:
        targets = (padded["shift_labels"] != IGNORE_INDEX).sum()
        out["num_items_in_batch"] = targets.to(torch.float32) / layout.size
    return out

"""LoRA adapters on the Zebra vLLM model: which adapters vLLM can serve, and the error for those it cannot.

The serving itself is vLLM's (``SupportsLoRA`` on ``ZebraForCausalLM``: every linear layer, the packed
ones through ``packed_modules_mapping``). vLLM refuses DoRA, LoRA bias, ``modules_to_save`` (what
LLaMA-Factory writes for ``additional_target`` and ``resize_vocab``), PiSSA-style inits, ranks above
``--max-lora-rank`` and target modules the model has no LoRA layer for (Zebra: ``embed_tokens``,
``lm_head``, the GDN convolutions), but its message names neither the adapter nor a way out, and an
adapter passed to ``vllm serve --lora-modules`` is only refused at startup. :func:`load_adapter_naming_the_fix`
wraps vLLM's adapter loading (installed by ``seams.py``) so the refusal reads, for a Zebra model only::

    LoRA adapter 'name' (DIR) cannot be served by the Zebra vLLM model: <vLLM's reason>. Fix: ...

with the fix that applies: ``--max-lora-rank`` for a rank over the limit, else merging the adapter into
the base with ``llamafactory-cli export`` and serving the merged model without ``--enable-lora``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

# vLLM's accepted values of max_lora_rank (``vllm.config.lora.MaxLoRARanks``).
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

MERGE_FIX = (
    "merge the adapter into the base model with `llamafactory-cli export` (model_name_or_path: BASE, "
    "adapter_name_or_path: {path}, export_dir: MERGED) and serve MERGED without --enable-lora"
)


def adapter_rank(adapter_dir: str | Path) -> int | None:
    """The largest rank ``adapter_config.json`` declares (``r`` and ``rank_pattern``), None if unreadable."""
    try:
        config = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
        return max([int(config["r"]), *map(int, (config.get("rank_pattern") or {}).values())])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def refusal(name: str, path: str, reason: str, max_lora_rank: int) -> str:
    """The error an unservable adapter stops with: adapter, directory, vLLM's reason and the fix."""
    rank = adapter_rank(path)
    if rank is not None and rank > max_lora_rank:
        allowed = [r for r in MAX_LORA_RANKS if r >= rank]
        fix = (
            f"start vLLM with --max-lora-rank {allowed[0]} (engine argument max_lora_rank; it is {max_lora_rank})"
            if allowed
            else MERGE_FIX.format(path=path)
        )
    else:
        fix = MERGE_FIX.format(path=path)
    return f"LoRA adapter {name!r} ({path}) cannot be served by the Zebra vLLM model: {reason}. Fix: {fix}"


def load_adapter_naming_the_fix(load_adapter: Callable) -> Callable:
    """Wrap ``WorkerLoRAManager._load_adapter``: for a Zebra model, a refused adapter is named with its fix."""

    @functools.wraps(load_adapter)
    def zebra_load_adapter(self, lora_request):
        from .model import ZebraForCausalLM

        try:
            return load_adapter(self, lora_request)
        except (ValueError, RuntimeError) as error:
            if not isinstance(self._adapter_manager.model, ZebraForCausalLM):
                raise
            reason = str(error).rstrip(". ")
            message = refusal(lora_request.lora_name, lora_request.lora_path, reason, self.lora_config.max_lora_rank)
            raise ValueError(message) from error

    return zebra_load_adapter

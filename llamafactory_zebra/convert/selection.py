"""Sensitivity-based layer selection: put MLA where turning attention into GDN hurts the base most.

As Zebra-Llama's SMART selection and HyLo do, each layer is scored by how far the base model's
next-token distribution moves when that layer alone is replaced by its GDN initialisation:
``KL(p_base || p_converted)`` averaged over the scored tokens. The ``N`` highest-scoring layers become
MLA. The base is loaded once (``AutoModelForCausalLM``); each layer's attention is swapped for the GDN
mixer ``gdn_init`` would write, scored, and swapped back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..configuration_zebra import ZebraConfig
from ..kernels import this_machine
from .gdn_init import init_gdn_from_attention
from .hybrid_plan import ConversionOptions
from .source import BaseCheckpoint, ConversionInputError


def read_text(path: str | Path) -> str:
    """The text of a .txt file, or every string value of a .json / .jsonl file (messages, instruction/output…)."""
    path = Path(path)
    if path.suffix not in (".json", ".jsonl"):
        return path.read_text(encoding="utf-8")
    raw = path.read_text(encoding="utf-8")
    records = (
        [json.loads(line) for line in raw.splitlines() if line.strip()]
        if path.suffix == ".jsonl"
        else [json.loads(raw)]
    )
    pieces: list[str] = []

    def collect(value) -> None:
        if isinstance(value, str):
            pieces.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, list):
            for item in value:
                collect(item)

    collect(records)
    return "\n".join(pieces)


def scoring_tokens(checkpoint: BaseCheckpoint, options: ConversionOptions) -> torch.Tensor:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(checkpoint.path)
    except (OSError, ValueError) as error:
        raise ConversionInputError(
            f"BASE {checkpoint.path}: no usable tokenizer for --select sensitivity ({error})"
        ) from error
    ids = tokenizer(read_text(options.data), add_special_tokens=False)["input_ids"][: options.score_tokens]
    if len(ids) < 8:
        raise ConversionInputError(f"--data {options.data}: only {len(ids)} tokens; sensitivity needs at least 8")
    return torch.tensor([ids])


class _MixerAsAttention(nn.Module):
    """Lets a GDN mixer stand where the base decoder layer calls ``self_attn`` (which returns a pair)."""

    def __init__(self, mixer: nn.Module) -> None:
        super().__init__()
        self.mixer = mixer

    def forward(self, hidden_states: torch.Tensor, **kwargs) -> tuple[torch.Tensor, None]:
        return self.mixer(hidden_states), None


def kl_divergence(reference_logits: torch.Tensor, logits: torch.Tensor) -> float:
    """Mean over tokens of ``KL(softmax(reference) || softmax(logits))``."""
    reference = torch.log_softmax(reference_logits.double(), dim=-1)
    other = torch.log_softmax(logits.double(), dim=-1)
    return float((reference.exp() * (reference - other)).sum(-1).mean())


@torch.no_grad()
def layer_sensitivity(
    checkpoint: BaseCheckpoint, config: ZebraConfig, options: ConversionOptions, log: Callable[[str], None] = print
) -> dict[int, float]:
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM

    from ..layers.gated_deltanet import ZebraGatedDeltaNet

    tokens = scoring_tokens(checkpoint, options)
    device = "cuda" if this_machine().has_gpu else "cpu"
    dtype = checkpoint.shape.dtype if device == "cuda" else torch.float32
    log(f"scoring {checkpoint.shape.num_layers} layers on {tokens.shape[1]} tokens of {options.data} ({device})")
    model = AutoModelForCausalLM.from_pretrained(checkpoint.path, dtype=dtype).to(device).eval()
    tokens = tokens.to(device)
    reference = model(tokens).logits.float()
    shape, scores = checkpoint.shape, {}
    for index, layer in enumerate(tqdm(model.model.layers, desc="scoring layers", unit="layer")):
        attention = layer.self_attn
        weights = {key: getattr(attention, f"{key}_proj").weight.float().cpu() for key in ("q", "k", "v", "o")}
        init = init_gdn_from_attention(
            weights,
            config,
            index,
            num_heads=shape.num_heads,
            num_kv_heads=shape.num_kv_heads,
            seed=options.seed,
        )
        mixer = ZebraGatedDeltaNet(config, index)
        mixer.load_state_dict(init.weights)
        layer.self_attn = _MixerAsAttention(mixer.to(device=device, dtype=dtype))
        try:
            scores[index] = kl_divergence(reference, model(tokens).logits.float())
        finally:
            layer.self_attn = attention
    return scores


def most_sensitive(scores: dict[int, float], count: int) -> list[int]:
    """The ``count`` layers with the highest scores (ties: the earlier layer), in layer order."""
    ranked = sorted(scores, key=lambda index: (-scores[index], index))
    return sorted(ranked[:count])

"""Reading a Transformer base checkpoint (Qwen3 dense or Llama-3, transformers layout) tensor by tensor.

The converter never holds the base model in memory: it reads the tensor names and shapes from the
safetensors headers up front (to reject a base with missing weights before any work), then loads
the handful of tensors one decoder layer needs, and lets them go.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

# transformers class name -> what the converter knows about that family.
SUPPORTED_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
}
SUPPORTED_MODEL_TYPES = set(SUPPORTED_ARCHITECTURES.values())


class ConversionInputError(ValueError):
    """The base, the plan or an option is unusable; raised before any weight is read or written."""


@dataclass(frozen=True)
class BaseShape:
    """The numbers of the base Transformer the conversion depends on."""

    family: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    has_qk_norm: bool
    dtype: torch.dtype
    rope_type: str
    max_position_embeddings: int


def read_base_config(base: Path) -> dict[str, Any]:
    config_file = base / "config.json"
    if not base.is_dir():
        raise ConversionInputError(f"BASE {base}: not a directory (expected a transformers checkpoint directory)")
    if not config_file.is_file():
        raise ConversionInputError(f"BASE {base}: no config.json (expected a transformers checkpoint directory)")
    with open(config_file, encoding="utf-8") as f:
        return json.load(f)


def base_shape(config: dict[str, Any], where: str) -> BaseShape:
    """Check the architecture is one the converter supports and collect its dimensions."""
    supported = ", ".join(f"{name} (model_type {kind!r})" for name, kind in SUPPORTED_ARCHITECTURES.items())
    architectures = config.get("architectures") or []
    model_type = config.get("model_type")
    family = next((SUPPORTED_ARCHITECTURES[a] for a in architectures if a in SUPPORTED_ARCHITECTURES), None)
    if family is None or model_type not in SUPPORTED_MODEL_TYPES:
        raise ConversionInputError(
            f"{where}: architecture {architectures or '?'} (model_type {model_type!r}) is not supported; "
            f"supported bases are dense {supported} checkpoints in the transformers layout"
        )
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise ConversionInputError(
            f"{where}: attention_bias/mlp_bias is true; Zebra layers have no projection biases, so only "
            "bias-free Qwen3/Llama-3 bases can be converted"
        )
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = rope.get("rope_theta", config.get("rope_theta", 10_000.0 if family == "llama" else 1_000_000.0))
    dtype_name = config.get("dtype") or config.get("torch_dtype") or "float32"
    return BaseShape(
        family=family,
        hidden_size=hidden,
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        vocab_size=config["vocab_size"],
        rope_theta=float(theta),
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        has_qk_norm=family == "qwen3",
        dtype=getattr(torch, dtype_name),
        rope_type=rope.get("rope_type", rope.get("type", "default")),
        max_position_embeddings=config.get("max_position_embeddings", 32768),
    )


def layer_tensor_names(shape: BaseShape, index: int) -> dict[str, str]:
    """Short name -> checkpoint key of every tensor one base decoder layer holds."""
    prefix = f"model.layers.{index}."
    names = {
        "q": "self_attn.q_proj.weight",
        "k": "self_attn.k_proj.weight",
        "v": "self_attn.v_proj.weight",
        "o": "self_attn.o_proj.weight",
        "input_layernorm": "input_layernorm.weight",
        "post_attention_layernorm": "post_attention_layernorm.weight",
        "gate_proj": "mlp.gate_proj.weight",
        "up_proj": "mlp.up_proj.weight",
        "down_proj": "mlp.down_proj.weight",
    }
    if shape.has_qk_norm:
        names.update(q_norm="self_attn.q_norm.weight", k_norm="self_attn.k_norm.weight")
    return {short: prefix + name for short, name in names.items()}


def expected_base_shapes(shape: BaseShape) -> dict[str, tuple[int, ...]]:
    """Every tensor the converter reads, with the shape the config promises."""
    hidden, d, inter = shape.hidden_size, shape.head_dim, shape.intermediate_size
    per_layer = {
        "q": (shape.num_heads * d, hidden),
        "k": (shape.num_kv_heads * d, hidden),
        "v": (shape.num_kv_heads * d, hidden),
        "o": (hidden, shape.num_heads * d),
        "input_layernorm": (hidden,),
        "post_attention_layernorm": (hidden,),
        "gate_proj": (inter, hidden),
        "up_proj": (inter, hidden),
        "down_proj": (hidden, inter),
        "q_norm": (d,),
        "k_norm": (d,),
    }
    expected = {"model.embed_tokens.weight": (shape.vocab_size, hidden), "model.norm.weight": (hidden,)}
    if not shape.tie_word_embeddings:
        expected["lm_head.weight"] = (shape.vocab_size, hidden)
    for index in range(shape.num_layers):
        for short, key in layer_tensor_names(shape, index).items():
            expected[key] = per_layer[short]
    return expected


class BaseCheckpoint:
    """Lazy access to the tensors of a sharded safetensors checkpoint, by name."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.config = read_base_config(self.path)
        self.shape = base_shape(self.config, str(self.path))
        self.files = sorted(self.path.glob("*.safetensors"))
        if not self.files:
            raise ConversionInputError(f"BASE {self.path}: no *.safetensors weight files (pytorch .bin is not read)")
        self.location: dict[str, Path] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        for file in self.files:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():
                    self.location[key] = file
                    self.shapes[key] = tuple(handle.get_slice(key).get_shape())

    def verify(self) -> None:
        """Every weight the conversion reads is present with the shape the config promises."""
        missing, wrong = [], []
        for key, shape in expected_base_shapes(self.shape).items():
            if key not in self.shapes:
                missing.append(key)
            elif self.shapes[key] != shape:
                wrong.append(f"{key} has shape {list(self.shapes[key])}, config.json implies {list(shape)}")
        if missing or wrong:
            lines = [f"BASE {self.path}: the weights do not match its config.json"]
            if missing:
                more = " …" if len(missing) > 8 else ""
                lines.append(f"  missing ({len(missing)}): {', '.join(missing[:8])}{more}")
            lines.extend(f"  {problem}" for problem in wrong[:8])
            raise ConversionInputError("\n".join(lines))

    def read(self, keys: list[str]) -> dict[str, torch.Tensor]:
        """Load ``keys`` (grouped by shard, each shard opened once); nothing else is kept."""
        by_file: dict[Path, list[str]] = {}
        for key in keys:
            by_file.setdefault(self.location[key], []).append(key)
        tensors = {}
        for file, names in by_file.items():
            with safe_open(str(file), framework="pt") as handle:
                for name in names:
                    tensors[name] = handle.get_tensor(name)
        return tensors

    def read_layer(
        self, index: int, only: tuple[str, ...] | None = None, skip: tuple[str, ...] = ()
    ) -> dict[str, torch.Tensor]:
        """One decoder layer's tensors by short name (``q``, ``gate_proj``, …), optionally a subset of them."""
        names = {
            short: key
            for short, key in layer_tensor_names(self.shape, index).items()
            if (only is None or short in only) and short not in skip
        }
        tensors = self.read(list(names.values()))
        return {short: tensors[key] for short, key in names.items()}

    def layer_numel(self, index: int) -> int:
        """Parameters of one base decoder layer, from the headers (no tensor is read)."""
        return sum(torch.Size(self.shapes[key]).numel() for key in layer_tensor_names(self.shape, index).values())

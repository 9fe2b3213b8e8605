"""``convert_checkpoint``: a Qwen3 / Llama-3 checkpoint → a native Zebra checkpoint, one layer at a time.

Everything that can be wrong with the input (architecture, missing weights, ranks, the layer plan,
the output directory) is checked before the first layer is converted. Then embeddings, each decoder
layer and the head are read from the base shards, converted and handed to a shard writer, so peak
memory is about one output shard plus one layer, whatever the model size.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..configuration_zebra import GDN, MLA, MLA_NORM_NONE, MLA_NORM_QK_HEAD, ZebraConfig
from ..inventory import parameter_shapes
from ..released import TOKENIZER_AND_GENERATION_FILES
from .gdn_init import init_gdn_from_attention
from .hybrid_plan import (
    SELECTIONS,
    ConversionOptions,
    ZebraDims,
    check_both_kinds,
    check_layer_indices,
    layer_types_from,
    requested_num_mla,
    resolve_dims,
    uniform_mla_layers,
)
from .mla_init import init_mla_from_attention
from .report import ConversionReport, LayerReport, base_kv_bytes_per_token, gdn_state_bytes, kv_bytes_per_token
from .source import BaseCheckpoint, BaseShape, ConversionInputError
from .writer import ShardedSafetensorsWriter

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32,
          "fp16": torch.float16, "float16": torch.float16}  # fmt: skip


@dataclass
class ConversionResult:
    output: Path
    config: ZebraConfig
    report: ConversionReport
    scores: dict | None = None


def zebra_config_for(shape: BaseShape, base_config: dict, dims: ZebraDims, layer_types: list[str]) -> ZebraConfig:
    """The native Zebra config of the converted model (validated by ``ZebraConfig`` itself)."""
    values = {
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "layer_types": layer_types,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "q_lora_rank": dims.q_lora_rank,
        "kv_lora_rank": dims.kv_lora_rank,
        "qk_nope_head_dim": dims.qk_nope_head_dim,
        "qk_rope_head_dim": dims.qk_rope_head_dim,
        "v_head_dim": dims.v_head_dim,
        "gdn_num_heads": dims.gdn_num_heads,
        "gdn_head_dim": dims.gdn_head_dim,
        "gdn_expand_v": dims.gdn_expand_v,
        "gdn_conv_size": dims.gdn_conv_size,
        "hidden_act": base_config.get("hidden_act", "silu"),
        "max_position_embeddings": shape.max_position_embeddings,
        "initializer_range": base_config.get("initializer_range", 0.02),
        "rms_norm_eps": shape.rms_norm_eps,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": shape.rope_theta},
        "bos_token_id": base_config.get("bos_token_id"),
        "eos_token_id": base_config.get("eos_token_id"),
        "pad_token_id": base_config.get("pad_token_id"),
        # The released layout: interleaved rope pairs; Qwen3's q/k norms become the MLA per-head norms.
        "rope_interleave": True,
        "mla_norm": MLA_NORM_QK_HEAD if shape.has_qk_norm else MLA_NORM_NONE,
    }
    try:
        config = ZebraConfig(**values)
    except ValueError as error:
        raise ConversionInputError(f"the converted model's config is invalid: {error}") from error
    config.architectures = ["ZebraForCausalLM"]
    return config


def approximations(shape: BaseShape, config: ZebraConfig) -> list[str]:
    notes = [
        f"MLA: base rotary pairs other than every {shape.head_dim // config.qk_rope_head_dim}-th become nope dims "
        "and lose their rotation",
        "MLA: one rope key for all heads, the mean of the KV heads' rope rows of W_K (exact only when they agree)",
        f"MLA: W_Q truncated to rank {config.q_lora_rank}, [W_K nope; W_V] to rank {config.kv_lora_rank} (see errors)",
        "GDN: only the q/k/v/o projections come from the base; decay, beta, gate, convolutions are freshly "
        "initialised",
    ]
    if shape.tie_word_embeddings:
        notes.append("lm_head: the base ties it to embed_tokens; the Zebra checkpoint stores an untied copy")
    if shape.rope_type != "default":
        notes.append(f"RoPE: the base's {shape.rope_type!r} scaling is not carried over (plain RoPE, same theta)")
    return notes


class _Planner:
    """Resolves and checks everything about a conversion before any weight is touched."""

    def __init__(self, base: str | Path, output: str | Path, options: ConversionOptions, overwrite: bool) -> None:
        self.checkpoint = BaseCheckpoint(base)
        self.shape = self.checkpoint.shape
        self.options = options
        self.output = Path(output)
        self.dims = resolve_dims(options, self.shape)
        self.dtype = self._dtype()
        if options.select not in SELECTIONS:
            raise ConversionInputError(f"--select {options.select!r}: choose one of {', '.join(SELECTIONS)}")
        self.num_mla = requested_num_mla(options, self.shape.num_layers)
        if options.mla_layers is not None:
            if options.select == "sensitivity":
                raise ConversionInputError("--select sensitivity chooses the layers itself; drop --mla-layers")
            self.mla_layers = check_layer_indices(list(options.mla_layers), self.shape.num_layers)
        else:
            self.mla_layers = uniform_mla_layers(self.shape.num_layers, self.num_mla)
        check_both_kinds(layer_types_from(self.mla_layers, self.shape.num_layers), options.allow_single_kind)
        if options.select == "sensitivity":
            if not options.data:
                raise ConversionInputError("--select sensitivity needs --data FILE (text to measure the KL on)")
            if not Path(options.data).is_file():
                raise ConversionInputError(f"--data {options.data}: no such file")
            if options.score_tokens < 8:
                raise ConversionInputError(f"--score-tokens {options.score_tokens}: use at least 8 tokens")
        # Validates the dimensions as the model will (head counts, rope dims, ...).
        self.config = zebra_config_for(self.shape, self.checkpoint.config, self.dims, self._layer_types())
        if self.output.exists() and any(self.output.iterdir()) and not overwrite:
            raise ConversionInputError(f"OUT {self.output}: not empty; pass --overwrite to write into it")
        if self.output.resolve() == self.checkpoint.path.resolve():
            raise ConversionInputError("OUT must differ from BASE")
        self.checkpoint.verify()

    def _dtype(self) -> torch.dtype:
        if self.options.dtype is None:
            return self.shape.dtype
        if self.options.dtype not in DTYPES:
            raise ConversionInputError(f"--dtype {self.options.dtype!r}: choose one of bf16, fp16, fp32")
        return DTYPES[self.options.dtype]

    def _layer_types(self) -> list[str]:
        return layer_types_from(self.mla_layers, self.shape.num_layers)

    def choose_layers(self, log: Callable[[str], None]) -> dict | None:
        if self.options.select != "sensitivity":
            return None
        from .selection import layer_sensitivity, most_sensitive

        scores = layer_sensitivity(self.checkpoint, self.config, self.options, log=log)
        self.mla_layers = most_sensitive(scores, self.num_mla)
        self.config = zebra_config_for(self.shape, self.checkpoint.config, self.dims, self._layer_types())
        return {
            "metric": "KL(base || base with this layer converted to GDN)",
            "scores": scores,
            "mla_layers": self.mla_layers,
        }


def convert_checkpoint(
    base: str | Path,
    output: str | Path,
    options: ConversionOptions | None = None,
    *,
    overwrite: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> ConversionResult:
    """Convert ``base`` (Qwen3 dense or Llama-3, transformers layout) into a Zebra checkpoint at ``output``.

    Raises ``ConversionInputError`` before any work when the base, the plan or an option is unusable.
    """
    started = time.perf_counter()
    planner = _Planner(base, output, options or ConversionOptions(), overwrite)
    scores = planner.choose_layers(log)
    planner.output.mkdir(parents=True, exist_ok=True)
    for stale in [*planner.output.glob("*.safetensors"), *planner.output.glob("*.safetensors.index.json")]:
        stale.unlink()  # --overwrite: weights of an earlier conversion must not mix with these
    if scores is not None:
        with open(planner.output / "layer_scores.json", "w", encoding="utf-8") as f:
            json.dump(scores, f, indent=2)
    report = _write_model(planner, progress)
    _copy_tokenizer_and_generation_config(planner)
    report.seconds = round(time.perf_counter() - started, 2)
    report.save(planner.output)
    return ConversionResult(planner.output, planner.config, report, scores)


def _write_model(planner: _Planner, progress: bool) -> ConversionReport:
    shape, config, checkpoint, dtype = planner.shape, planner.config, planner.checkpoint, planner.dtype
    expected = parameter_shapes(config)
    written: set[str] = set()
    writer = ShardedSafetensorsWriter(planner.output, planner.options.max_shard_bytes)

    def emit(name: str, tensor: torch.Tensor) -> None:
        if name not in expected:
            raise RuntimeError(f"converter produced {name}, which the Zebra model does not have")
        if tuple(tensor.shape) != expected[name]:
            raise RuntimeError(f"converter produced {name} of shape {list(tensor.shape)}, expected {expected[name]}")
        writer.add(name, tensor.to(dtype))
        written.add(name)

    embed = checkpoint.read(["model.embed_tokens.weight"])["model.embed_tokens.weight"]
    emit("model.embed_tokens.weight", embed)
    if shape.tie_word_embeddings:
        emit("lm_head.weight", embed.clone())
    del embed

    rows = _convert_layers(planner, emit, expected, progress)

    tail = ["model.norm.weight"] + ([] if shape.tie_word_embeddings else ["lm_head.weight"])
    for name, tensor in checkpoint.read(tail).items():
        emit(name, tensor)
    writer.close()
    missing = sorted(set(expected) - written)
    if missing:
        raise RuntimeError(f"converter did not produce {missing[:8]}")

    itemsize = dtype.itemsize
    base_params = sum(torch.Size(s).numel() for s in checkpoint.shapes.values())
    if shape.tie_word_embeddings and "lm_head.weight" in checkpoint.shapes:
        base_params -= shape.vocab_size * shape.hidden_size
    return ConversionReport(
        base=str(checkpoint.path),
        base_family=shape.family,
        output=str(planner.output),
        dtype=str(dtype).removeprefix("torch."),
        layer_types=list(config.layer_types),
        layers=rows,
        base_params=base_params,
        params=sum(torch.Size(s).numel() for s in expected.values()),
        base_kv_bytes_per_token=base_kv_bytes_per_token(shape, itemsize),
        kv_bytes_per_token=kv_bytes_per_token(config, itemsize),
        gdn_state_bytes_per_sequence=gdn_state_bytes(config, itemsize),
        approximations=approximations(shape, config),
    )


ATTENTION_TENSORS = ("q", "k", "v", "o", "q_norm", "k_norm")


def _convert_layers(
    planner: _Planner, emit, expected: dict[str, tuple[int, ...]], progress: bool
) -> list[LayerReport]:
    """Convert every decoder layer in order, factorising the MLA layers on worker threads.

    The factorisations are most of a conversion's CPU time, so all of them are queued before the first
    layer is written: the workers start at once and their eigendecompositions (LAPACK, GIL released) run
    beside the reading, GDN initialisation and writing of the other layers instead of after them. One
    worker per torch thread, each single-threaded: independent layers use the cores better than one
    multi-threaded ``eigh`` does. The queue holds only the MLA layers' attention weights (a few percent of
    the model: the MLPs and the embeddings are read when their layer's turn comes), and each result is
    written as soon as it is ready, so memory stays about one output shard plus a layer per worker.
    """
    shape, config = planner.shape, planner.config
    rows: dict[int, LayerReport] = {}
    mla_layers = [index for index in range(shape.num_layers) if config.layer_types[index] == MLA]

    def finish(index: int, future: Future) -> None:
        rows[index] = _write_mla_layer(planner, emit, expected, index, future.result())

    layers = tqdm(range(shape.num_layers), desc="converting layers", unit="layer", disable=not progress)
    workers = max(1, min(len(mla_layers), torch.get_num_threads()))
    with (
        single_threaded_torch(workers > 1),
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mla-factorisation") as factoriser,
    ):
        pending = deque((index, _submit_mla_factorisation(planner, factoriser, index)) for index in mla_layers)
        for index in layers:
            layers.set_postfix_str(config.layer_types[index])
            gdn_row = _write_layer_outside_mla(planner, emit, expected, index)
            if gdn_row is not None:
                rows[index] = gdn_row
            while pending and pending[0][0] <= index and pending[0][1].done():
                finish(*pending.popleft())
        while pending:
            finish(*pending.popleft())
    return [rows[index] for index in range(shape.num_layers)]


def _submit_mla_factorisation(planner: _Planner, factoriser: ThreadPoolExecutor, index: int) -> Future:
    """Queue MLA layer ``index``'s factorisation from its attention weights (read now: they are small)."""
    shape, config = planner.shape, planner.config
    return factoriser.submit(
        init_mla_from_attention,
        planner.checkpoint.read_layer(index, only=ATTENTION_TENSORS),
        num_heads=shape.num_heads,
        num_kv_heads=shape.num_kv_heads,
        mla_kv_heads=config.num_key_value_heads,
        qk_rope_head_dim=config.qk_rope_head_dim,
        q_lora_rank=config.q_lora_rank,
        kv_lora_rank=config.kv_lora_rank,
        interleave=config.rope_interleave,
    )


def _write_mla_layer(planner: _Planner, emit, expected: dict[str, tuple[int, ...]], index: int, init) -> LayerReport:
    """Write a finished MLA factorisation and its report row."""
    for name, tensor in init.weights.items():
        emit(f"model.layers.{index}.mla.{name}", tensor)
    return LayerReport(
        index,
        MLA,
        planner.checkpoint.layer_numel(index),
        _layer_params(expected, index),
        q_rank=init.q.rank,
        q_relative_error=init.q.relative_error,
        q_energy_kept=init.q.energy_kept,
        kv_rank=init.kv.rank,
        kv_relative_error=init.kv.relative_error,
        kv_energy_kept=init.kv.energy_kept,
        rope_key_spread=init.rope_key_spread,
    )


def _write_layer_outside_mla(
    planner: _Planner, emit, expected: dict[str, tuple[int, ...]], index: int
) -> LayerReport | None:
    """Write layer ``index``'s norms and MLP, and for a GDN layer its mixer (HyLo copies); the GDN layer's report
    row, ``None`` for an MLA layer (its mixer comes from the factoriser)."""
    shape, config = planner.shape, planner.config
    is_mla = config.layer_types[index] == MLA
    tensors = planner.checkpoint.read_layer(index, skip=ATTENTION_TENSORS if is_mla else ())
    prefix = f"model.layers.{index}."
    for name in ("input_layernorm", "post_attention_layernorm"):
        emit(f"{prefix}{name}.weight", tensors[name])
    for name in ("gate_proj", "up_proj", "down_proj"):
        emit(f"{prefix}mlp.{name}.weight", tensors[name])
    del tensors["gate_proj"], tensors["up_proj"], tensors["down_proj"]
    if is_mla:
        return None
    init = init_gdn_from_attention(
        tensors, config, index, num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads, seed=planner.options.seed
    )
    for name, tensor in init.weights.items():
        emit(f"{prefix}gdn.{name}", tensor)
    copied = {name: f"{kind} 0..{n} of {total}" for name, (kind, n, total) in init.copied.items()}
    numel = planner.checkpoint.layer_numel(index)
    return LayerReport(index, GDN, numel, _layer_params(expected, index), copied=copied)


@contextlib.contextmanager
def single_threaded_torch(enabled: bool) -> Iterator[None]:
    """One intra-op thread while several workers factorise, so they do not oversubscribe the cores."""
    threads = torch.get_num_threads()
    if enabled:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _layer_params(expected: dict[str, tuple[int, ...]], index: int) -> int:
    prefix = f"model.layers.{index}."
    return sum(torch.Size(shape).numel() for name, shape in expected.items() if name.startswith(prefix))


def _copy_tokenizer_and_generation_config(planner: _Planner) -> None:
    source, output = planner.checkpoint.path, planner.output
    for name in TOKENIZER_AND_GENERATION_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, output / name)
    planner.config.dtype = str(planner.dtype).removeprefix("torch.")
    planner.config.save_pretrained(output)
    if not (output / "generation_config.json").is_file():
        from transformers import GenerationConfig

        GenerationConfig.from_model_config(planner.config).save_pretrained(output)

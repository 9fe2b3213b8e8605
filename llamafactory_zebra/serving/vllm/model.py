"""``ZebraForCausalLM`` for vLLM: Qwen3 decoder blocks whose token mixer is MLA or Gated DeltaNet.

Built the way vLLM's own hybrids (``qwen3_next.py``) are: vLLM's vocab embedding, ``RMSNorm`` with the
fused residual add, merged gate/up MLP, ``ParallelLMHead`` + ``LogitsProcessor``, ``IsHybrid`` /
``HasInnerState`` so the engine allocates GDN state slots next to the paged attention cache. The mixers
are in ``mla.py`` and ``gdn.py``.

Loading is strict (``checkpoint_entries``: the keys and shapes follow from the model's own parameters and
``packed_modules_mapping``, as vLLM's own models declare it): a checkpoint key the layer plan does not
have, one it lacks, or one of the wrong shape stops the engine before it serves, naming the key. vLLM's
own loaders would fail on a wrong shape with an assertion that names neither key nor file.
Tensor and pipeline parallelism are refused (only one process's path was built and tested).
"""

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.mamba.mamba_utils import MambaStateCopyFunc, MambaStateCopyFuncCalculator
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid, SupportsLoRA
from vllm.model_executor.models.utils import extract_layer_index, maybe_prefix
from vllm.sequence import IntermediateTensors

from ...configuration_zebra import MLA, ZebraConfig
from ...inventory import parameter_shapes
from .gdn import GDN_PACKED_MODULES, ZebraGatedDeltaNet, gdn_state_dtype, gdn_state_shape
from .mla import ZebraMLAAttention
from .startup import announce

# vLLM's packed parameters and the checkpoint modules stacked into them, in shard order (vLLM's
# ``packed_modules_mapping``: the loader reads it to route checkpoint keys, LoRA to split adapters).
PACKED_MODULES = {"gate_up_proj": ["gate_proj", "up_proj"], **GDN_PACKED_MODULES}

# Parameters whose checkpoint tensors carry an extra singleton dimension (at this index): transformers'
# depthwise ``nn.Conv1d`` weights are ``[C, 1, W]``, vLLM's conv ops take ``[C, W]``.
CHECKPOINT_SINGLETON_DIM = {"conv1d.weight": 1}


@dataclass(frozen=True)
class CheckpointEntry:
    """Where one checkpoint key loads: a vLLM parameter, its shard in a packed parameter, the key's shape."""

    parameter: str
    shard: int | None
    shape: tuple[int, ...]


def checkpoint_entries(model: nn.Module, packed_modules: dict[str, list[str]]) -> dict[str, CheckpointEntry]:
    """Every checkpoint key (transformers' names) the vLLM ``model`` needs and its shape, derived from the
    model's own parameters: a packed parameter (``packed_modules``) expects one key per shard, the shard's
    rows being its layer's ``output_sizes``; an embedding or head its unpadded vocabulary rows."""
    modules = dict(model.named_modules())
    entries: dict[str, CheckpointEntry] = {}
    for name, param in model.named_parameters():
        module_name, _, leaf = name.rpartition(".")
        parent, _, packed = module_name.rpartition(".")
        singleton = CHECKPOINT_SINGLETON_DIM.get(f"{packed}.{leaf}")
        if packed not in packed_modules:
            shape = tuple(param.shape)
            if isinstance(modules[module_name], VocabParallelEmbedding):  # vLLM pads the vocabulary rows
                shape = (modules[module_name].num_embeddings, *shape[1:])
            entries[name] = CheckpointEntry(name, None, _checkpoint_shape(shape, singleton))
            continue
        sizes = modules[module_name].output_sizes
        for shard, (part, rows) in enumerate(zip(packed_modules[packed], sizes, strict=True)):
            shape = _checkpoint_shape((rows, *param.shape[1:]), singleton)
            entries[f"{parent}.{part}.{leaf}"] = CheckpointEntry(name, shard, shape)
    return entries


def _check_entries_against_inventory(
    entries: dict[str, CheckpointEntry], inventory: dict[str, tuple[int, ...]]
) -> None:
    """The names and shapes a checkpoint must hold are the transformers model's (``inventory.parameter_shapes``,
    the one list); this vLLM model must take exactly those, or its modules or ``PACKED_MODULES`` drifted."""
    entry_shapes = {name: entry.shape for name, entry in entries.items()}
    if entry_shapes != inventory:
        differ = sorted(set(entry_shapes) ^ set(inventory)) or sorted(
            name for name in inventory if entry_shapes[name] != inventory[name]
        )
        raise RuntimeError(
            "the vLLM Zebra model does not take the checkpoint the transformers model defines "
            f"(llamafactory_zebra.inventory): {', '.join(differ[:8])}{' …' if len(differ) > 8 else ''}; "
            "serving/vllm/model.py's modules or PACKED_MODULES no longer match the layers"
        )


def _checkpoint_shape(shape: tuple[int, ...], singleton: int | None) -> tuple[int, ...]:
    return shape if singleton is None else (*shape[:singleton], 1, *shape[singleton:])


class ZebraMLP(nn.Module):
    def __init__(self, config: ZebraConfig, prefix: str) -> None:
        super().__init__()
        if config.hidden_act != "silu":
            raise ValueError(f"ZebraConfig.hidden_act: the vLLM model runs 'silu' only, got {config.hidden_act!r}")
        size = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [size, size], bias=False, prefix=f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(size, config.hidden_size, bias=False, prefix=f"{prefix}.down_proj")
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        x, _ = self.down_proj(self.act_fn(gate_up))
        return x


class ZebraDecoderLayer(nn.Module):
    def __init__(self, config: ZebraConfig, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        self.layer_type = config.layer_types[extract_layer_index(prefix)]
        if self.layer_type == MLA:
            self.mla = ZebraMLAAttention(config, vllm_config, prefix=f"{prefix}.mla")
        else:
            self.gdn = ZebraGatedDeltaNet(config, vllm_config, prefix=f"{prefix}.gdn")
        self.mlp = ZebraMLP(config, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        if self.layer_type == MLA:
            hidden_states = self.mla(positions, hidden_states)
        else:
            hidden_states = self.gdn(hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


# No ``from __future__ import annotations`` here: ``support_torch_compile`` reads forward's type hints.
@support_torch_compile
class ZebraModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config: ZebraConfig = vllm_config.model_config.hf_text_config
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            ZebraDecoderLayer(config, vllm_config, prefix=f"{prefix}.layers.{i}")
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden_states = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class ZebraForCausalLM(nn.Module, HasInnerState, IsHybrid, SupportsLoRA):
    packed_modules_mapping = PACKED_MODULES
    # No LoRA on the embedding or the head: LLaMA-Factory's ``lora_target: all`` leaves both out, and with
    # none declared vLLM keeps its plain logits processor (whose LoRA variant fails on CPU prompt log-probs).
    embedding_modules: dict[str, str] = {}

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config: ZebraConfig = vllm_config.model_config.hf_text_config
        if not isinstance(config, ZebraConfig):
            raise TypeError(f"ZebraForCausalLM needs a ZebraConfig, got {type(config).__name__}")
        parallel = vllm_config.parallel_config
        if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
            raise ValueError(
                "tensor_parallel_size / pipeline_parallel_size: the Zebra vLLM model runs on one process only "
                f"(got {parallel.tensor_parallel_size} / {parallel.pipeline_parallel_size})"
            )
        announce(vllm_config)  # the run's known issues (bf16 on a CPU that emulates it) and the model runner
        self.config = config
        self.model = ZebraModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "lm_head"))
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig) -> tuple[tuple[int, ...], ...]:
        speculative = vllm_config.speculative_config
        num_spec = speculative.num_speculative_tokens if speculative else 0
        return gdn_state_shape(vllm_config.model_config.hf_text_config, num_spec)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig) -> tuple[torch.dtype, torch.dtype]:
        return gdn_state_dtype(vllm_config)

    @classmethod
    def get_mamba_state_copy_func(cls) -> tuple[MambaStateCopyFunc, MambaStateCopyFunc]:
        return MambaStateCopyFuncCalculator.gated_delta_net_state_copy_func()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load transformers-named weights; refuse a missing, extra or mis-shaped key by name.

        ``tie_word_embeddings``: the transformers model never ties its head (it declares no tied keys), so a
        checkpoint's ``lm_head.weight`` is the head whatever the flag says; only a checkpoint that sets the
        flag and omits ``lm_head.weight`` gets the embedding as its head.
        """
        expected = checkpoint_entries(self, self.packed_modules_mapping)
        _check_entries_against_inventory(expected, parameter_shapes(self.config))
        params = dict(self.named_parameters())
        seen: set[str] = set()
        loaded: set[str] = set()
        for name, tensor in weights:
            entry = expected.get(name)
            if entry is None:
                raise ValueError(
                    f"checkpoint weight {name!r} is not part of this Zebra model "
                    f"(layer plan {self.config.layer_types}, mla_norm {self.config.mla_norm!r}, "
                    f"q_lora_rank {self.config.q_lora_rank}); "
                    "the checkpoint does not match its config.json"
                )
            if tuple(tensor.shape) != entry.shape:
                raise ValueError(_shape_error(name, tensor, entry.shape))
            seen.add(name)
            param = params[entry.parameter]
            loader = getattr(param, "weight_loader", default_weight_loader)
            if entry.shard is None:
                loader(param, tensor)
            else:
                loader(param, tensor, entry.shard)
            loaded.add(entry.parameter)
        if self.config.tie_word_embeddings and "lm_head.weight" not in seen:
            seen.add("lm_head.weight")
            self.lm_head.weight.data.copy_(params["model.embed_tokens.weight"].data)
            loaded.add("lm_head.weight")
        missing = sorted(set(expected) - seen)
        if missing:
            raise ValueError(
                f"checkpoint is missing {len(missing)} weight(s) this Zebra config needs: {', '.join(missing[:8])}"
                + (" …" if len(missing) > 8 else "")
            )
        return loaded


def _shape_error(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> str:
    return f"checkpoint weight {name!r} has shape {tuple(tensor.shape)}, but this Zebra config needs {shape}"

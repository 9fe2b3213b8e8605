"""``ZebraForCausalLM`` for vLLM: Qwen3 decoder blocks whose token mixer is MLA or Gated DeltaNet.

Built the way vLLM's own hybrids (``qwen3_next.py``) are: vLLM's vocab embedding, ``RMSNorm`` with the
fused residual add, merged gate/up MLP, ``ParallelLMHead`` + ``LogitsProcessor``, ``IsHybrid`` /
``HasInnerState`` so the engine allocates GDN state slots next to the paged attention cache. The mixers
are in ``mla.py`` and ``gdn.py``.

Loading is strict (``checkpoint_shapes`` is the contract): a checkpoint key the layer plan does not
have, one it lacks, or one of the wrong shape stops the engine before it serves, naming the key. vLLM's
own loaders would fail on a wrong shape with an assertion that names neither key nor file.
Tensor and pipeline parallelism are refused (only one process's path was built and tested).
"""

from collections.abc import Iterable

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
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid
from vllm.model_executor.models.utils import extract_layer_index, maybe_prefix
from vllm.sequence import IntermediateTensors

from ...configuration_zebra import MLA, MLA_NORM_LORA, MLA_NORM_QK_HEAD, ZebraConfig
from .gdn import GDN_STACKED, ZebraGatedDeltaNet, gdn_state_dtype, gdn_state_shape
from .mla import ZebraMLAAttention

MLP_STACKED = (("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1))


def checkpoint_shapes(config: ZebraConfig) -> dict[str, tuple[int, ...]]:
    """Every key a Zebra checkpoint holds for ``config`` (transformers' names) and its shape."""
    hidden, bias = config.hidden_size, config.attention_bias
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    shapes["lm_head.weight"] = (config.vocab_size, hidden)  # optional with tie_word_embeddings (see load_weights)
    for index, layer_type in enumerate(config.layer_types):
        prefix = f"model.layers.{index}"
        layer = {
            "input_layernorm.weight": (hidden,),
            "post_attention_layernorm.weight": (hidden,),
            "mlp.gate_proj.weight": (config.intermediate_size, hidden),
            "mlp.up_proj.weight": (config.intermediate_size, hidden),
            "mlp.down_proj.weight": (hidden, config.intermediate_size),
        }
        layer.update(_mla_shapes(config, bias) if layer_type == MLA else _gdn_shapes(config))
        shapes.update({f"{prefix}.{name}": shape for name, shape in layer.items()})
    return shapes


def _mla_shapes(config: ZebraConfig, bias: bool) -> dict[str, tuple[int, ...]]:
    hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    rank, rope, qk = config.kv_lora_rank, config.qk_rope_head_dim, config.qk_head_dim
    linears = {"mla.kv_a_proj_with_mqa": (rank + rope, hidden), "mla.out_proj": (hidden, heads * config.v_head_dim)}
    if config.q_lora_rank is None:
        linears["mla.q_proj"] = (heads * qk, hidden)
    else:
        linears["mla.q_a_proj"] = (config.q_lora_rank, hidden)
    shapes = {f"{name}.weight": shape for name, shape in linears.items()}
    if bias:
        shapes.update({f"{name}.bias": (shape[0],) for name, shape in linears.items()})
    if config.q_lora_rank is not None:
        shapes["mla.q_b_proj.weight"] = (heads * qk, config.q_lora_rank)
    shapes["mla.kv_b_proj.weight"] = (kv_heads * (config.qk_nope_head_dim + config.v_head_dim), rank)
    if config.mla_norm == MLA_NORM_QK_HEAD:
        shapes.update({"mla.q_norm.weight": (qk,), "mla.k_norm.weight": (qk,)})
    elif config.mla_norm == MLA_NORM_LORA:
        shapes["mla.kv_a_layernorm.weight"] = (rank,)
        if config.q_lora_rank is not None:
            shapes["mla.q_a_layernorm.weight"] = (config.q_lora_rank,)
    return shapes


def _gdn_shapes(config: ZebraConfig) -> dict[str, tuple[int, ...]]:
    hidden, heads, width = config.hidden_size, config.gdn_num_heads, config.gdn_conv_size
    key_dim, value_dim = heads * config.gdn_head_dim, heads * config.gdn_head_v_dim
    return {
        "gdn.q_proj.weight": (key_dim, hidden),
        "gdn.k_proj.weight": (key_dim, hidden),
        "gdn.v_proj.weight": (value_dim, hidden),
        "gdn.g_proj.weight": (value_dim, hidden),
        "gdn.a_proj.weight": (heads, hidden),
        "gdn.b_proj.weight": (heads, hidden),
        "gdn.A_log": (heads,),
        "gdn.dt_bias": (heads,),
        "gdn.q_conv1d.weight": (key_dim, 1, width),
        "gdn.k_conv1d.weight": (key_dim, 1, width),
        "gdn.v_conv1d.weight": (value_dim, 1, width),
        "gdn.o_norm.weight": (config.gdn_head_v_dim,),
        "gdn.o_proj.weight": (hidden, value_dim),
    }


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
            self.mla = ZebraMLAAttention(
                config, vllm_config.cache_config, vllm_config.quant_config, prefix=f"{prefix}.mla"
            )
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


class ZebraForCausalLM(nn.Module, HasInnerState, IsHybrid):
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
        expected = checkpoint_shapes(self.config)
        params = dict(self.named_parameters())
        seen: set[str] = set()
        loaded: set[str] = set()
        for name, tensor in weights:
            if name not in expected:
                raise ValueError(
                    f"checkpoint weight {name!r} is not part of this Zebra model (layer plan {self.config.layer_types}, "
                    f"mla_norm {self.config.mla_norm!r}, q_lora_rank {self.config.q_lora_rank}); "
                    "the checkpoint does not match its config.json"
                )
            if tuple(tensor.shape) != expected[name]:
                raise ValueError(_shape_error(name, tensor, expected[name]))
            seen.add(name)
            target, shard = _vllm_parameter(name)
            param = params[target]
            loader = getattr(param, "weight_loader", default_weight_loader)
            if shard is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard)
            loaded.add(target)
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


def _vllm_parameter(name: str) -> tuple[str, int | None]:
    """The vLLM parameter a checkpoint key loads into, and its shard in a stacked parameter."""
    for mixer, table in (("mlp", MLP_STACKED), ("gdn", GDN_STACKED)):
        for stacked, original, shard in table:
            if f".{mixer}.{original}." in name:
                return name.replace(f".{mixer}.{original}.", f".{mixer}.{stacked}."), shard
    return name, None

"""Zebra's Gated DeltaNet token mixer on vLLM's state management, computed by this project's ops.

vLLM supplies everything around the recurrence: ``GatedDeltaNetAttention`` (a ``MambaBase`` layer, so
the engine allocates per-request conv and SSM state slots from the shapes of
``MambaStateShapeCalculator.gated_delta_net_state_shape`` and hands their indices over in
``GDNAttentionMetadata``), its linear layers and gated ``RMSNormGated``.

What it cannot supply is the compute for Zebra's shapes. vLLM's CPU GDN kernel requires key head =
value head (Zebra: 256 vs 512), rejects head 256 and runs bf16 only; its GPU path is fla's Triton code
(its own copy in ``vllm.third_party``), not verified here for these shapes. So :func:`zebra_gdn_core`
runs this project's ops — ``ops.causal_conv1d`` (prefill, continued from a slot's conv window) /
``causal_conv1d_update`` (decode) and ``ops.chunk_gated_delta_rule`` / ``fused_recurrent_gated_delta_rule``
(which dispatch to fla's kernels on a GPU, PyTorch elsewhere) — on the states gathered from the
request's slots, and writes the final states back to the same slots. Each request is its own segment
(``cu_seqlens`` from the metadata), so batched requests never share a window or a state.

Zebra keeps separate ``q_conv1d``/``k_conv1d``/``v_conv1d`` weights; being depthwise, they are one
convolution over the concatenated channels, loaded into one ``conv1d`` parameter (as vLLM's OLMo
hybrid loads its three). The SSM state is kept in fp32 unless ``mamba_ssm_cache_dtype`` says otherwise:
the transformers model carries it in fp32 whatever the activations' dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.layernorm import RMSNormGated
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from vllm.model_executor.layers.mamba.gdn.base import GatedDeltaNetAttention
from vllm.model_executor.layers.mamba.mamba_utils import (
    MambaStateDtypeCalculator,
    MambaStateShapeCalculator,
    is_conv_state_dim_first,
)
from vllm.model_executor.utils import set_weight_attrs
from vllm.utils.torch_utils import direct_register_custom_op

from ...configuration_zebra import ZebraConfig
from ...ops import (
    causal_conv1d,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
)

# Checkpoint names of the stacked parameters: (vLLM parameter, checkpoint module, shard).
GDN_STACKED = (
    ("qkvg_proj", "q_proj", 0),
    ("qkvg_proj", "k_proj", 1),
    ("qkvg_proj", "v_proj", 2),
    ("qkvg_proj", "g_proj", 3),
    ("conv1d", "q_conv1d", 0),
    ("conv1d", "k_conv1d", 1),
    ("conv1d", "v_conv1d", 2),
)


def gdn_state_shape(config: ZebraConfig, num_spec: int = 0) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """vLLM's GDN state shapes for Zebra: conv window over q|k|v channels, SSM state ``[H, V, K]``."""
    return MambaStateShapeCalculator.gated_delta_net_state_shape(
        1,
        config.gdn_num_heads,
        config.gdn_num_heads,
        config.gdn_head_dim,
        config.gdn_head_v_dim,
        config.gdn_conv_size,
        num_spec,
    )


def gdn_state_dtype(vllm_config: VllmConfig) -> tuple[torch.dtype, torch.dtype]:
    cache_config = vllm_config.cache_config
    ssm_dtype = cache_config.mamba_ssm_cache_dtype
    return MambaStateDtypeCalculator.gated_delta_net_state_dtype(
        vllm_config.model_config.dtype, cache_config.mamba_cache_dtype, "float32" if ssm_dtype == "auto" else ssm_dtype
    )


def _conv_weight_loader(channels: list[int]):
    """Loads ``q_conv1d``/``k_conv1d``/``v_conv1d`` (``[C, 1, W]``) into their rows of the joint ``[ΣC, W]``."""
    offsets = [sum(channels[:i]) for i in range(len(channels))]

    def load(param: torch.Tensor, loaded: torch.Tensor, shard: int) -> None:
        param.data[offsets[shard] : offsets[shard] + channels[shard]].copy_(loaded.squeeze(1))

    return load


class ZebraGatedDeltaNet(GatedDeltaNetAttention):
    def __init__(self, config: ZebraConfig, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__(config, vllm_config, prefix=prefix)
        if self.num_spec:
            raise ValueError("speculative decoding is not supported by the Zebra vLLM model (GDN layers)")
        self.zebra_config = config
        self.state_dtypes = gdn_state_dtype(vllm_config)
        self.num_heads = config.gdn_num_heads
        self.head_k_dim = config.gdn_head_dim
        self.head_v_dim = config.gdn_head_v_dim
        self.key_dim = self.num_heads * self.head_k_dim
        self.value_dim = self.num_heads * self.head_v_dim
        self.conv_kernel_size = config.gdn_conv_size
        self.activation = "silu"

        self.qkvg_proj = MergedColumnParallelLinear(
            self.hidden_size, [self.key_dim, self.key_dim, self.value_dim, self.value_dim], bias=False,
            quant_config=self.quant_config, prefix=f"{prefix}.qkvg_proj",
        )  # fmt: skip
        self.a_proj = ReplicatedLinear(self.hidden_size, self.num_heads, bias=False, prefix=f"{prefix}.a_proj")
        self.b_proj = ReplicatedLinear(self.hidden_size, self.num_heads, bias=False, prefix=f"{prefix}.b_proj")
        self.A_log = nn.Parameter(torch.empty(self.num_heads))
        self.dt_bias = nn.Parameter(torch.empty(self.num_heads))
        channels = [self.key_dim, self.key_dim, self.value_dim]
        self.conv1d = nn.Module()
        self.conv1d.weight = nn.Parameter(torch.empty(sum(channels), self.conv_kernel_size))
        set_weight_attrs(self.conv1d.weight, {"weight_loader": _conv_weight_loader(channels)})
        self.o_norm = RMSNormGated(self.head_v_dim, eps=config.gdn_norm_eps, norm_before_gate=True)
        self.o_proj = RowParallelLinear(
            self.value_dim, self.hidden_size, bias=False, quant_config=self.quant_config, prefix=f"{prefix}.o_proj"
        )

        compilation_config = get_current_vllm_config().compilation_config
        if prefix in compilation_config.static_forward_context:
            raise ValueError(f"Duplicate layer name: {prefix}")
        compilation_config.static_forward_context[prefix] = self

    def get_state_shape(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return gdn_state_shape(self.zebra_config, self.num_spec)

    def get_state_dtype(self) -> tuple[torch.dtype, torch.dtype]:
        return self.state_dtypes

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        num_tokens = hidden_states.shape[0]
        qkvg, _ = self.qkvg_proj(hidden_states)
        mixed, gate = qkvg.split([2 * self.key_dim + self.value_dim, self.value_dim], dim=-1)
        a, _ = self.a_proj(hidden_states)
        b, _ = self.b_proj(hidden_states)
        core = torch.zeros(num_tokens, self.num_heads, self.head_v_dim, dtype=hidden_states.dtype,
                           device=hidden_states.device)  # fmt: skip
        torch.ops.vllm.zebra_gdn_core(mixed.contiguous(), a, b, core, self.prefix)
        output = self.o_norm(core, gate.reshape(num_tokens, self.num_heads, self.head_v_dim))
        output, _ = self.o_proj(output.reshape(num_tokens, self.value_dim))
        return output

    def recurrence(self, mixed: torch.Tensor, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
        """Conv + gated delta rule over this step's tokens, reading and writing the requests' state slots."""
        metadata = get_forward_context().attn_metadata
        if metadata is None or metadata.get(self.prefix) is None:
            return  # profiling / warm-up runs carry no state metadata
        metadata = metadata[self.prefix]
        count = metadata.num_actual_tokens
        if count == 0:
            return
        slots = metadata.non_spec_state_indices_tensor[: metadata.num_decodes + metadata.num_prefills].long()
        starts = metadata.non_spec_query_start_loc[: slots.numel() + 1]
        conv_cache, ssm_cache = self.kv_cache
        conv_cache = conv_cache if is_conv_state_dim_first() else conv_cache.transpose(-1, -2)  # [S, C, W-1]
        ssm_cache = ssm_cache.transpose(-1, -2)  # [S, H, K, V]

        # The project's conv state carries W columns (the oldest one unread); vLLM's slot holds W - 1.
        conv_state = F.pad(conv_cache[slots], [1, 0])
        ssm_state = ssm_cache[slots].float()
        if metadata.has_initial_state is not None:
            fresh = ~metadata.has_initial_state[: slots.numel()]
            conv_state[fresh] = 0
            ssm_state[fresh] = 0

        mixed, a, b = mixed[:count], a[:count], b[:count]
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        weight = self.conv1d.weight
        decode_only = metadata.num_prefills == 0
        if decode_only:
            conv_out, _ = causal_conv1d_update(mixed, conv_state, weight, activation="silu")
            final_conv = conv_state
            batched = (conv_out[:, None], g[:, None], beta[:, None])
            rule, cu_seqlens = fused_recurrent_gated_delta_rule, None
        else:
            conv_out, final_conv = causal_conv1d(
                mixed[None], weight, activation="silu", initial_state=conv_state, output_final_state=True,
                cu_seqlens=starts,
            )  # fmt: skip
            batched = (conv_out, g[None], beta[None])
            rule, cu_seqlens = chunk_gated_delta_rule, starts
        conv_out, g, beta = batched
        q, k, v = conv_out.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        output, final_ssm = rule(
            q.unflatten(-1, (self.num_heads, self.head_k_dim)),
            k.unflatten(-1, (self.num_heads, self.head_k_dim)),
            v.unflatten(-1, (self.num_heads, self.head_v_dim)),
            g=g,
            beta=beta,
            initial_state=ssm_state,
            output_final_state=True,
            cu_seqlens=cu_seqlens,
            use_qk_l2norm_in_kernel=True,
        )
        conv_cache[slots] = final_conv[..., 1:].to(conv_cache.dtype)
        ssm_cache[slots] = final_ssm.to(ssm_cache.dtype)
        out[:count] = output.reshape(count, self.num_heads, self.head_v_dim).to(out.dtype)


def zebra_gdn_core(mixed: torch.Tensor, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, layer_name: str) -> None:
    """Custom-op door to :meth:`ZebraGatedDeltaNet.recurrence`: opaque to ``torch.compile`` (it reads the
    forward context and mutates the state slots), as vLLM's own GDN layers make their cores."""
    get_forward_context().no_compile_layers[layer_name].recurrence(mixed, a, b, out)


def _zebra_gdn_core_fake(mixed, a, b, out, layer_name) -> None:
    return None


direct_register_custom_op("zebra_gdn_core", zebra_gdn_core, mutates_args=["out"], fake_impl=_zebra_gdn_core_fake)

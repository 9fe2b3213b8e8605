"""Zebra's Gated DeltaNet token mixer on vLLM's state management, computed by this project's ops.

vLLM supplies everything around the recurrence: ``GatedDeltaNetAttention`` (a ``MambaBase`` layer, so
the engine allocates per-request conv and SSM state slots from the shapes of
``MambaStateShapeCalculator.gated_delta_net_state_shape`` and hands their indices over in
``GDNAttentionMetadata``), its linear layers and gated ``RMSNormGated``.

What it cannot supply is the compute for Zebra's shapes. vLLM's CPU GDN kernel requires key head =
value head (Zebra: 256 vs 512), rejects head 256 and runs bf16 only; its GPU path is fla's Triton code
(its own copy in ``vllm.third_party``), not verified here for these shapes. So :func:`zebra_gdn_core`
runs this project's slot-indexed ops on the requests' state slots: the gates (``ops.gdn_gates``, the
training layer's formula), the conv (``ops.causal_conv1d_in_slots`` / ``causal_conv1d_update_in_slots``)
and the recurrence (``ops.chunk_gated_delta_rule_in_slots`` for prompt chunks,
``ops.fused_recurrent_gated_delta_rule_in_slots`` for decode tokens). The layer binds its ops once, when it is
built, as vLLM's own layers bind their kernels: the facts of their calls (dtype, state dtype and layout, platform)
are fixed per layer, so it asks the kernel registry (``kernels/registry.py``) once per op (``kernels.fixed_call``):
fla on a GPU, the package's C++ kernels or PyTorch on a CPU; this module only reads vLLM's metadata and slot
layout. The conv is the registry's ``conv in slots`` op (this module binds its entries' functions for decode
tokens and prompt chunks): vLLM's own C++ causal conv, a vLLM kernel ``ops/`` cannot import, where it fits
(:func:`conv_in_slots_call`), else the project's conv op. Each request is its own segment (``cu_seqlens`` from the
metadata), so batched requests never share a window or a state.

Zebra keeps separate ``q_conv1d``/``k_conv1d``/``v_conv1d`` weights; being depthwise, they are one
convolution over the concatenated channels, loaded into one ``conv1d`` parameter (as vLLM's OLMo
hybrid loads its three). The SSM state is kept in fp32 unless ``mamba_ssm_cache_dtype`` says otherwise:
the transformers model carries it in fp32 whatever the activations' dtype.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm import _custom_ops as vllm_ops
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
from vllm.platforms import current_platform
from vllm.utils.torch_utils import direct_register_custom_op

from ...configuration_zebra import ZebraConfig
from ...kernels import Call, EntryPoint, Family, KernelLoadError, Key, Op, bind, fixed_call
from ...ops import (
    causal_conv1d_in_slots,
    causal_conv1d_update_in_slots,
    chunk_gated_delta_rule_in_slots,
    cpu_kernels,
    fused_recurrent_gated_delta_rule_in_slots,
    gated_rms_norm,
    gdn_gates,
)
from ...ops.gated_delta_rule.in_slots import decode_step_call, prefill_call

# vLLM's packed parameters and the checkpoint modules stacked into them, in shard order (the layer's
# ``output_sizes``): part of the model's ``packed_modules_mapping`` (loader and LoRA).
GDN_PACKED_MODULES = {
    "qkvg_proj": ["q_proj", "k_proj", "v_proj", "g_proj"],
    "conv1d": ["q_conv1d", "k_conv1d", "v_conv1d"],
}


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
        dtype, device_type = vllm_config.model_config.dtype, current_platform.device_type
        # The layer's ops, chosen once: their calls' facts are fixed per layer.
        self.conv = fixed_call(Op.CONV_IN_SLOTS, conv_in_slots_call(dtype, self.conv_kernel_size))
        self.decode_step = fixed_call(Op.GDN_DECODE_STEP, decode_step_call(device_type, dtype, self.state_dtypes[1]))
        self.prefill = fixed_call(Op.GDN_PREFILL_IN_SLOTS, prefill_call(device_type, dtype, self.state_dtypes[1]))
        if self.decode_step.kernel.family == Family.CPP:
            try:
                cpu_kernels()  # build (or load the cached build of) the C++ CPU kernels at load, not mid-request
            except KernelLoadError:
                pass  # warned once; each op passes its C++ entry over on its first call

        self.qkvg_proj = MergedColumnParallelLinear(
            self.hidden_size,
            [self.key_dim, self.key_dim, self.value_dim, self.value_dim],
            bias=False,
            quant_config=self.quant_config,
            prefix=f"{prefix}.qkvg_proj",
        )
        self.a_proj = ReplicatedLinear(self.hidden_size, self.num_heads, bias=False, prefix=f"{prefix}.a_proj")
        self.b_proj = ReplicatedLinear(self.hidden_size, self.num_heads, bias=False, prefix=f"{prefix}.b_proj")
        self.A_log = nn.Parameter(torch.empty(self.num_heads))
        self.dt_bias = nn.Parameter(torch.empty(self.num_heads))
        channels = [self.key_dim, self.key_dim, self.value_dim]
        self.conv1d = nn.Module()
        self.conv1d.weight = nn.Parameter(torch.empty(sum(channels), self.conv_kernel_size))
        self.conv1d.output_sizes = channels
        set_weight_attrs(self.conv1d.weight, {"weight_loader": _conv_weight_loader(channels)})
        self.o_norm = ZebraRMSNormGated(self.head_v_dim, eps=config.gdn_norm_eps, norm_before_gate=True)
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
        core = torch.zeros(
            num_tokens, self.num_heads, self.head_v_dim, dtype=hidden_states.dtype, device=hidden_states.device
        )
        # Standard strides even for one token (``contiguous()`` keeps a 1-row view's row stride), which
        # vLLM's C++ conv checks.
        mixed = mixed.clone(memory_format=torch.contiguous_format)
        torch.ops.vllm.zebra_gdn_core(mixed, a, b, core, self.prefix)
        output = self.o_norm(core, gate.reshape(num_tokens, self.num_heads, self.head_v_dim))
        output, _ = self.o_proj(output.reshape(num_tokens, self.value_dim))
        return output

    def recurrence(self, mixed: torch.Tensor, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
        """Conv + gated delta rule over this step's tokens, reading and writing the requests' state slots.

        vLLM orders a step's requests decodes first (one token each, always with a prior state: a
        request's first chunk counts as a prefill), then prefills; each part gets its own path.
        """
        metadata = get_forward_context().attn_metadata
        if metadata is None or metadata.get(self.prefix) is None:
            return  # profiling / warm-up runs carry no state metadata
        metadata = metadata[self.prefix]
        count = metadata.num_actual_tokens
        if count == 0:
            return
        decodes, decode_tokens = metadata.num_decodes, metadata.num_decode_tokens
        slots = metadata.non_spec_state_indices_tensor[: decodes + metadata.num_prefills].long()
        g, beta = gdn_gates(a[:count], b[:count], self.A_log, self.dt_bias)
        if decodes:
            tokens = slice(0, decode_tokens)
            self._decode(mixed[tokens], g[tokens], beta[tokens], slots[:decodes], out[tokens])
        if metadata.num_prefills:
            tokens = slice(decode_tokens, count)
            starts = metadata.non_spec_query_start_loc[decodes : slots.numel() + 1] - decode_tokens
            fresh = ~metadata.has_initial_state[decodes : slots.numel()]
            self._prefill(mixed[tokens], g[tokens], beta[tokens], slots[decodes:], starts, fresh, out[tokens])

    def _state_slots(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The conv cache as ``[slots, C, W - 1]`` and the SSM cache as ``[slots, H, K, V]`` views.

        vLLM allocates the SSM slot as ``[H, V, K]``; only this layer reads it, so it is viewed (not
        transposed) as ``[H, K, V]``, as vLLM's own CPU GDN layer does: the in-place steps read and
        write each state row contiguously in V.
        """
        conv_cache, ssm_cache = self.kv_cache
        conv_cache = conv_cache if is_conv_state_dim_first() else conv_cache.transpose(-1, -2)
        slots, heads, value_dim, key_dim = ssm_cache.shape
        return conv_cache, ssm_cache.view(slots, heads, key_dim, value_dim)

    def _split_heads(self, conv_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = conv_out.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        return (
            q.unflatten(-1, (self.num_heads, self.head_k_dim)),
            k.unflatten(-1, (self.num_heads, self.head_k_dim)),
            v.unflatten(-1, (self.num_heads, self.head_v_dim)),
        )

    def _decode(self, mixed, g, beta, slots, out) -> None:
        """One token per request: the conv windows and the SSM states advance in their slots."""
        conv_cache, ssm_cache = self._state_slots()
        conv_out = self.conv(mixed, self.conv1d.weight, conv_cache, slots, entry_point=EntryPoint.STEP)
        q, k, v = self._split_heads(conv_out)
        output = fused_recurrent_gated_delta_rule_in_slots(
            q, k, v, g, beta, ssm_cache, slots, use_qk_l2norm_in_kernel=True, chosen=self.decode_step
        )
        out.copy_(output.reshape(out.shape))

    def _prefill(self, mixed, g, beta, slots, starts, fresh, out) -> None:
        """Whole prompt chunks, one ``cu_seqlens`` segment per request, from each slot's state (zeros for a
        request's first chunk); final states go back to the slots."""
        conv_cache, ssm_cache = self._state_slots()
        arguments = (mixed, self.conv1d.weight, conv_cache, slots, starts, ~fresh)
        conv_out = self.conv(*arguments, entry_point=EntryPoint.PREFILL)
        q, k, v = self._split_heads(conv_out)
        output = chunk_gated_delta_rule_in_slots(
            q,
            k,
            v,
            g[None],
            beta[None],
            ssm_cache,
            slots,
            starts,
            ~fresh,
            use_qk_l2norm_in_kernel=True,
            chosen=self.prefill,
        )
        out.copy_(output.reshape(out.shape))


class ZebraRMSNormGated(RMSNormGated):
    """vLLM's ``RMSNormGated`` (fla's fused kernel on a GPU; plain PyTorch that ``torch.compile`` fuses), with
    the package's one-pass CPU op where vLLM runs it eagerly on a CPU (``ops/gated_rms_norm.py`` says why)."""

    def forward_cpu(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        plain = z is not None and self.group_size is None and self.norm_before_gate and self.activation != "sigmoid"
        if not plain or torch.compiler.is_compiling():
            return self.forward_native(x, z)
        return gated_rms_norm(x, z, self.weight, self.eps)


def conv_in_slots_call(dtype: torch.dtype, width: int) -> Call:
    """The layer's ``conv in slots`` call: what the registry needs to choose between ``vllm-cpp``, vLLM's C++
    causal conv (``vllm._custom_ops.causal_conv1d_*_cpu``; its speed against this project's PyTorch conv:
    ``benchmarks/bench_vllm_gdn_cpu.py``), which takes bf16 activations, a 4-wide window and vLLM's default
    conv-state layout on its CPU platform on a CPU with bf16 dot products, and ``conv-op``, this project's conv
    op, which dispatches to fla on a GPU. Fixed per layer, so it is built once, with the layer."""
    return Call.on(
        current_platform.device_type,
        dtype,
        width=width,
        conv_state_dim_first=is_conv_state_dim_first(),
        vllm_cpu_platform=current_platform.is_cpu(),
    )


def _vllm_conv_step(mixed, weight, conv_cache, slots) -> torch.Tensor:
    return vllm_ops.causal_conv1d_update_cpu(
        x=mixed,
        conv_states=conv_cache,
        weight=weight,
        bias=None,
        silu_activation=True,
        conv_state_indices=slots.to(torch.int32),
        is_weight_packed=False,
    )


def _vllm_conv_prefill(mixed, weight, conv_cache, slots, starts, initial) -> torch.Tensor:
    return vllm_ops.causal_conv1d_fwd_cpu(
        x=mixed.transpose(0, 1),
        weight=weight,
        bias=None,
        conv_states=conv_cache,
        query_start_loc=starts.to(torch.int32),
        cache_indices=slots.to(torch.int32),
        has_initial_state=initial,
        silu_activation=True,
        is_weight_packed=False,
    ).transpose(0, 1)[None]


def _conv_op_prefill(mixed, weight, conv_cache, slots, starts, initial) -> torch.Tensor:
    return causal_conv1d_in_slots(mixed[None], weight, conv_cache, slots, starts, initial)


bind(Op.CONV_IN_SLOTS, {Key.VLLM_CPP: _vllm_conv_step, Key.CONV_OP: causal_conv1d_update_in_slots}, EntryPoint.STEP)
bind(Op.CONV_IN_SLOTS, {Key.VLLM_CPP: _vllm_conv_prefill, Key.CONV_OP: _conv_op_prefill}, EntryPoint.PREFILL)


def zebra_gdn_core(mixed: torch.Tensor, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, layer_name: str) -> None:
    """Custom-op door to :meth:`ZebraGatedDeltaNet.recurrence`: opaque to ``torch.compile`` (it reads the
    forward context and mutates the state slots), as vLLM's own GDN layers make their cores."""
    get_forward_context().no_compile_layers[layer_name].recurrence(mixed, a, b, out)


def _zebra_gdn_core_fake(mixed, a, b, out, layer_name) -> None:
    return None


direct_register_custom_op("zebra_gdn_core", zebra_gdn_core, mutates_args=["out"], fake_impl=_zebra_gdn_core_fake)

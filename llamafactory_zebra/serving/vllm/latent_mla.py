"""MLA attention that caches the latent: the cache layer, its attention backend and metadata builder for vLLM.

vLLM's own MLA path cannot serve Zebra: its CPU kernels compile DeepSeek's 576-wide latent only, its
``kv_b_proj`` absorption asserts one up-projection per query head (Zebra's are per key head, GQA), no vLLM
MLA kernel applies the per-key-head scale ``mla_norm: qk_head`` needs, and on CPU the ``use_mla`` route
turns chunked prefill and prefix caching off. So, as vLLM's DeepSeek-V3.2 indexer cache does, the plugin
declares a layer of its own (``AttentionLayerBase``) with its own page layout and backend, on vLLM's generic
allocator, scheduler and block tables (chunked prefill and prefix caching stay vLLM's):

- a page row per token is ``ZebraConfig.mla_cache_channels`` values in the model dtype (``ops/latent_attention/
  layout.py``: the latent, the rotated rope key, each key head's ``1 / rms`` for ``qk_head``), declared as a
  one-head ``FullAttentionSpec`` without values (:func:`latent_cache_spec`, the one place the row's bytes are
  counted: the layer's spec and the backend's ``customize_spec``, through which vLLM's hybrid block
  alignment sizes blocks so that one GDN state page is one latent block);
- decode tokens attend absorbed (the registry's ``MLA latent decode``: the query moved into latent space,
  the scale applied to the scores, ``W_UV`` after), prompt tokens, chunked or behind a prefix hit, attend to
  the request's whole cached context expanded one key block at a time (``latent_prefill``); new rows are
  written first, so both read the cache only.

The projections, norms and RoPE stay in ``mla.py``'s ``ZebraMLAAttention``, which hands this layer the
rotated queries and the new rows and owns the up-projection (``expand``/``absorb`` here read its weights).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.platforms import current_platform
from vllm.utils.torch_utils import direct_register_custom_op
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills
from vllm.v1.kv_cache_interface import AttentionSpec, FullAttentionSpec

from ...kernels import Call, Op, fixed_call
from ...ops.latent_attention import latent_prefill


def latent_cache_spec(
    block_size: int, dtype: torch.dtype, row: int, page_size_padded: int | None = None
) -> FullAttentionSpec:
    """One ``row``-value vector per token (no separate values): what a latent page holds."""
    return FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=row,
        head_size_v=0,
        dtype=dtype,
        page_size_padded=page_size_padded,
    )


@dataclass
class ZebraLatentMetadata:
    """One step's view of the batch for the latent layers, decodes first (``reorder_batch_threshold = 1``)."""

    num_actual_tokens: int
    num_decodes: int
    num_decode_tokens: int
    query_start_loc: torch.Tensor  # [reqs + 1]
    seq_lens: torch.Tensor  # [reqs], the new tokens included
    block_table: torch.Tensor  # [reqs, blocks]
    slot_mapping: torch.Tensor  # [tokens]


class ZebraLatentMetadataBuilder(AttentionMetadataBuilder[ZebraLatentMetadata]):
    reorder_batch_threshold = 1

    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config: VllmConfig, device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._init_reorder_batch_threshold(1)

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> ZebraLatentMetadata:
        common = common_attn_metadata
        decodes, _, decode_tokens, _ = split_decodes_and_prefills(common, decode_threshold=1)
        reqs, tokens = common.num_reqs, common.num_actual_tokens
        return ZebraLatentMetadata(
            num_actual_tokens=tokens,
            num_decodes=decodes,
            num_decode_tokens=decode_tokens,
            query_start_loc=common.query_start_loc_cpu[: reqs + 1],
            seq_lens=common.seq_lens[:reqs],
            block_table=common.block_table_tensor[:reqs],
            slot_mapping=common.slot_mapping[:tokens],
        )


class ZebraLatentBackend(AttentionBackend):
    """The latent layers' backend: their page layout and metadata builder (the layer computes attention).

    ``row`` is set per model by :func:`latent_backend`: vLLM's hybrid alignment asks the first attention
    backend's ``customize_spec`` what one token's page costs, a classmethod with no model at hand."""

    row: int = 0
    supported_dtypes = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes = ["auto"]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError("the Zebra latent MLA layer computes its own attention (latent_mla.py)")

    @staticmethod
    def get_builder_cls() -> type[ZebraLatentMetadataBuilder]:
        return ZebraLatentMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(16)]

    @classmethod
    def customize_spec(cls, spec: AttentionSpec) -> AttentionSpec:
        return latent_cache_spec(spec.block_size, spec.dtype, cls.row, spec.page_size_padded)


@functools.cache
def latent_backend(row: int) -> type[ZebraLatentBackend]:
    """The backend class for ``row``-value cache rows (one class per row size, so vLLM's by-class grouping
    and its ``full_cls_name`` dedupe see one backend per layout)."""
    name = f"ZebraLatentBackend{row}"
    return type(name, (ZebraLatentBackend,), {"row": row, "__qualname__": name, "__module__": __name__})


class ZebraLatentCache(nn.Module, AttentionLayerBase):
    """The paged latent cache of one MLA layer and the attention that reads it (module docstring).

    ``owner`` is the ``ZebraMLAAttention`` whose ``absorb``/``expand``/``up_project`` turn queries and rows
    into latent-space queries, keys and values; it is not registered as a submodule (it holds this one)."""

    def __init__(self, owner: nn.Module, row: int, scale: float, dtype: torch.dtype, prefix: str) -> None:
        super().__init__()
        self.row = row
        self.scale = scale
        self.dtype = dtype
        self.prefix = prefix
        self.num_heads = owner.num_heads
        self.kv_cache = torch.tensor([])
        # The absorbed decode, chosen once (kernel registry: Triton on a GPU, PyTorch elsewhere).
        self.decode = fixed_call(Op.LATENT_DECODE, Call.on(current_platform.device_type, dtype))
        object.__setattr__(self, "owner", owner)  # not a submodule: the owner holds this layer
        compilation_config = get_current_vllm_config().compilation_config
        if prefix in compilation_config.static_forward_context:
            raise ValueError(f"Duplicate layer name: {prefix}")
        compilation_config.static_forward_context[prefix] = self

    def get_attn_backend(self) -> type[AttentionBackend]:
        return latent_backend(self.row)

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> FullAttentionSpec:
        return latent_cache_spec(vllm_config.cache_config.block_size, self.dtype, self.row)

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        """vLLM's post-load hook for attention layers (run after the linear layers' own): the owner's
        up-projection for the absorbed decode."""
        self.owner.load_up_projection(self.dtype)

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        self.kv_cache = kv_cache.squeeze(1)  # vLLM's [blocks, heads = 1, block_size, row] -> [blocks, block_size, row]

    def forward(self, query: torch.Tensor, rows: torch.Tensor, output: torch.Tensor) -> None:
        """Write this step's ``rows`` ``[T, row]`` into the cache, then ``output`` ``[T, H, Dv]`` from ``query``
        ``[T, H, Dqk]`` (rotated) for every token; a profiling run (no metadata) leaves ``output`` as it is."""
        torch.ops.vllm.zebra_latent_attention(query, rows, output, self.prefix)

    def attend(self, query: torch.Tensor, rows: torch.Tensor, output: torch.Tensor) -> None:
        metadata = get_forward_context().attn_metadata
        if not isinstance(metadata, dict) or metadata.get(self.prefix) is None:
            return
        metadata: ZebraLatentMetadata = metadata[self.prefix]
        count = metadata.num_actual_tokens
        if count == 0:
            return
        cache = self.kv_cache
        slots = metadata.slot_mapping.long()
        cache[slots // cache.shape[1], slots % cache.shape[1]] = rows[:count].to(cache.dtype)
        owner, decodes, decode_tokens = self.owner, metadata.num_decodes, metadata.num_decode_tokens
        if decodes:
            q_latent, q_rope = owner.absorb(query[:decode_tokens])
            context = self.decode(
                q_latent,
                q_rope,
                cache,
                metadata.block_table[:decodes],
                metadata.seq_lens[:decodes],
                self.scale,
                owner.num_kv_heads,
                owner.scales_offset,
            )
            output[:decode_tokens] = owner.up_project(context).to(output.dtype)
        if decode_tokens < count:
            starts = metadata.query_start_loc[decodes:] - decode_tokens
            output[decode_tokens:count] = latent_prefill(
                query[decode_tokens:count],
                cache,
                metadata.block_table[decodes:],
                starts,
                metadata.seq_lens[decodes:],
                owner.expand,
                self.scale,
                latent_dim=owner.kv_lora_rank,
                rope_dim=owner.rope_dim,
                kv_heads=owner.num_kv_heads,
                scales_offset=owner.scales_offset,
            ).to(output.dtype)


def zebra_latent_attention(query: torch.Tensor, rows: torch.Tensor, output: torch.Tensor, layer_name: str) -> None:
    """Custom-op door to :meth:`ZebraLatentCache.attend`: opaque to ``torch.compile`` (it reads the forward
    context and writes the cache), as ``gdn.py``'s ``zebra_gdn_core`` is."""
    get_forward_context().no_compile_layers[layer_name].attend(query, rows, output)


def _zebra_latent_attention_fake(query, rows, output, layer_name) -> None:
    return None


direct_register_custom_op(
    "zebra_latent_attention", zebra_latent_attention, mutates_args=["output"], fake_impl=_zebra_latent_attention_fake
)

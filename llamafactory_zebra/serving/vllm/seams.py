"""The vLLM side of the seam door: every vLLM name the serving plugin replaces or registers, with the upstream
source it was written against, and the vLLM API surface the serving layer reads.

vLLM offers no hook for any fix below, so :func:`install` (called by ``register()`` in every vLLM
process) loops over :data:`VLLM_SEAMS` (the mechanism is ``llamafactory_zebra/seam.py``): each wrapper
through ``seam.wrap``, the config parser through vLLM's own ``register_config_parser``. Each record keeps
the SHA-256 of the upstream source as read in every vLLM version it was re-read against (0.32.0 and 0.33.0:
one plugin version serves both; or the parameters relied on); ``tests_vllm/test_vllm_seams.py`` fails when
an upgrade changes any of them, so a changed upstream is re-read before the wrapper is trusted again, and
:func:`install` logs the drift at start-up.

:data:`VLLM_API` lists the vLLM names ``gdn.py``, ``mla.py``, ``latent_mla.py``, ``arch_config.py``, ``model.py``,
``config_parser.py``, ``runner.py`` and this module read without replacing them — the GDN metadata's fields, the
forward context's, the keyword names of ``vllm._custom_ops.causal_conv1d_*_cpu``, the argument order of
``MambaStateShapeCalculator.gated_delta_net_state_shape``, the layers' constructor keywords, the attention-layer
and backend interfaces the latent cache implements — checked with ``inspect`` by the same
test without starting an engine, so a vLLM bump fails naming the changed name, not as a parity failure.

0. Released-layout checkpoints (``config_parser.py``): a config parser under vLLM's ``hf`` name.

1. LoRA rows without an adapter (CPU). vLLM's CPU LoRA ops (``vllm/lora/ops/torch_ops/lora_ops.py``)
   select each token's adapter with ``stack[index]``; a request without an adapter has index -1, which
   PyTorch reads as the *last* adapter slot, so on a LoRA-enabled CPU server base-model requests were
   served with another request's adapter (and every decode step applies it, even with no adapter in the
   batch). :func:`_shrink_without_adapter_rows` zeroes the rank-``r`` activations of those rows after
   vLLM's shrink; the expand step then adds ``0 @ B = 0``. Zebra declares no LoRA embedding modules, so
   every LoRA path on its layers starts with this shrink. vLLM's GPU kernels skip index -1 themselves, and
   so do 0.33's CPU ops (upstream's fix: ``clamp(min=0)`` then ``masked_fill`` in the shrink and expand ops),
   where the wrapper zeroes rows that are already zero; it stays for 0.32 and goes when 0.32 support does.
2. Unservable adapters (``lora.py``): ``WorkerLoRAManager._load_adapter`` is wrapped so that an adapter
   vLLM refuses for a Zebra model is named with its directory, the reason and the fix. In 0.33 the
   ``modules_to_save`` and token-classification checks are one ``_validate_classification_head_lora``, which
   still raises ``ValueError`` for a ``modules_to_save`` adapter on a model without a classification head.
3. Prompt chunks cut at a stale block size (CPU, prefix caching on). In ``align`` mode the scheduler ends
   prompt chunks where the GDN states are cached, reading ``cache_config.block_size``. The engine core
   sets it to the KV cache's block size (sized so that a block's K/V bytes equal one GDN state's), but
   after the front-end handshake it re-runs ``VllmConfig.__post_init__``, and the CPU platform's
   ``check_and_update_config`` resets a block size the user did not pass to its default, 128. Every
   prompt was then cut at its last multiple of 128 (a 256-token prompt ran as two 128-token chunks, each
   a pass over its GDN states) while states are cached only at the larger block's borders: same answers,
   more work (what it cost the serving benchmark: docs/benchmarks-history.md).
   :func:`_split_at_the_mamba_block_size` puts the block size of the KV cache's Mamba groups back before
   vLLM's split runs, for Zebra models only. vLLM 0.33's ``check_and_update_config`` no longer resets a block
   size the user did not pass (it only warns about one the user passed that is not a multiple of 32), and its
   split still reads ``cache_config.block_size`` (it adds ``num_hash_lookahead_tokens`` to the checkpoint
   positions): there the wrapper should find the sizes equal and change nothing (read in the source, not
   run: this project has no engine on 0.33, docs/serving.md's tested versions).
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from types import ModuleType

import torch

from ...seam import Seam, original
from ...seam import install as install_seams

logger = logging.getLogger(__name__)
HINT = "re-read serving/vllm/seams.py's record of it, fix the code that relies on it and record the new value"


def _shrink_without_adapter_rows(shrink: Callable) -> Callable:
    """vLLM's ``bgmv_shrink``, then zero in the output every row whose adapter index is negative (no adapter)."""

    @functools.wraps(shrink)
    def zebra_bgmv_shrink(
        inputs: torch.Tensor,
        lora_weights: torch.Tensor,
        output_tensor: torch.Tensor,
        lora_indices_tensor: torch.Tensor,
        scaling: float = 1.0,
    ) -> None:
        shrink(inputs, lora_weights, output_tensor, lora_indices_tensor, scaling)
        without_adapter = lora_indices_tensor < 0
        if without_adapter.any():
            output_tensor[: len(lora_indices_tensor)][without_adapter] = 0

    return zebra_bgmv_shrink


def mamba_block_size(kv_cache_config) -> int | None:
    """The block size of the KV cache's Mamba groups (where align mode caches GDN states), or None."""
    from vllm.v1.kv_cache_interface import MambaSpec

    sizes = {
        g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups if isinstance(g.kv_cache_spec, MambaSpec)
    }
    return sizes.pop() if len(sizes) == 1 else None


def _split_at_the_mamba_block_size(split: Callable) -> Callable:
    """vLLM's ``Scheduler._mamba_block_aligned_split``, after restoring ``cache_config.block_size`` to the
    Mamba groups' block size for a Zebra model (fix 3 in the module docstring)."""
    from .config_parser import ARCHITECTURE

    @functools.wraps(split)
    def zebra_mamba_block_aligned_split(self, *args, **kwargs) -> int:
        if self.vllm_config.model_config.architecture == ARCHITECTURE:
            block_size = mamba_block_size(self.kv_cache_config)
            if block_size is not None and self.cache_config.block_size != block_size:
                self.cache_config.block_size = block_size
        return split(self, *args, **kwargs)

    return zebra_mamba_block_aligned_split


def _fixed_shrink(module: ModuleType) -> Callable:
    return _shrink_without_adapter_rows(original(module, "bgmv_shrink"))


def _the_fixed_shrink(module: ModuleType) -> Callable:
    """``punica_cpu`` imported ``bgmv_shrink`` by name: it gets the wrapper ``lora_ops`` got."""
    return importlib.import_module(LORA_OPS).bgmv_shrink


def _adapter_refusals(module: ModuleType) -> Callable:
    from .lora import load_adapter_naming_the_fix

    return load_adapter_naming_the_fix(original(module, "WorkerLoRAManager._load_adapter"))


def _split_fix(module: ModuleType) -> Callable:
    return _split_at_the_mamba_block_size(original(module, "Scheduler._mamba_block_aligned_split"))


def _released_layout_parser(module: ModuleType) -> None:
    from .config_parser import register_config_parser_for_released_layout

    register_config_parser_for_released_layout()


LORA_OPS = "vllm.lora.ops.torch_ops.lora_ops"
# bgmv_shrink as read in each vLLM version (0.33's zeroes rows without an adapter itself: fix 1 in the docstring).
_SHRINK = {
    "0.32.0": "e7a5eafed74a2bc1b505dd46bfba7fefff868ac36985a5a5bc9ab1fda2f713e1",
    "0.33.0": "ff08e86052b966c95c02955ac3d91b8dea5c38c5f90e5e95a4588994577b8eb8",
}
# What install() changes, in order, with the source each change was written against. Fix 1 wraps the shrink
# op where the prefill op (by its module-global name) and the CPU wrapper (decode steps, logits) call it.
VLLM_SEAMS: tuple[Seam, ...] = (
    Seam("vllm.transformers_utils.config", "register_config_parser", ("config_format",),
         register=_released_layout_parser, why="fix 0: released-layout checkpoints under the parser name hf"),
    Seam("vllm.transformers_utils.config", "HFConfigParser.parse",
         ("self", "model", "trust_remote_code", "revision", "code_revision"), why="fix 0: the parser it extends"),
    Seam(LORA_OPS, "bgmv_shrink", source_sha256=_SHRINK, wrapper=_fixed_shrink, why="fix 1"),
    Seam(LORA_OPS, "sgmv_shrink", source_sha256="1f116c7327f60a71ef43b66a326c6307adba5ede84f8a74ba1fa291ca4ccc090",
         why="fix 1: calls bgmv_shrink by its module-global name"),
    Seam("vllm.lora.punica_wrapper.punica_cpu", "bgmv_shrink", source_sha256=_SHRINK, wrapper=_the_fixed_shrink,
         why="fix 1: the name PunicaWrapperCPU calls"),
    Seam("vllm.lora.punica_wrapper.punica_cpu", "PunicaWrapperCPU",
         source_sha256="acc9bc9cf24eb2dbbcd0e4e2d3e01b007e3fafba3cf16fc2eba0571070afc30a", why="fix 1"),
    Seam("vllm.lora.worker_manager", "WorkerLoRAManager._load_adapter",
         source_sha256={"0.32.0": "e05648e184ddc4f7653516d774688af9e5864a851ea6ec34c49a93a39a942126",
                        "0.33.0": "57d439d629f9e10503320c4e07d353148d93124aafba3d1642f6fa1e406ed077"},
         wrapper=_adapter_refusals, why="fix 2"),
    Seam("vllm.v1.core.sched.scheduler", "Scheduler._mamba_block_aligned_split",
         source_sha256={"0.32.0": "b2a08c774ae495bfdd509380e8d14ccdd0bd2c5b70219720a926059a0d8eb9b0",
                        "0.33.0": "9af6739dbbdf081fb40351995325825352f9a96f86df21cdcc88cd357c120244"},
         wrapper=_split_fix, why="fix 3: the split that reads the block size"),
    Seam("vllm.platforms.cpu", "CpuPlatform.check_and_update_config",
         source_sha256={"0.32.0": "d2960ad5d183676793d6988a9a4ed50175d18dbf8baf70fc01f686d50887a0df",
                        "0.33.0": "c86f1806cdc327a52159f8c741a511759c90db5caec5c9dab62a56a2ba318046"},
         why="fix 3: the platform hook that resets it (0.32; 0.33's no longer does)"),
)  # fmt: skip

# The vLLM names the serving layer reads without replacing them (module docstring).
_GDN = "vllm.model_executor.layers.mamba"
_LINEAR = "vllm.model_executor.layers.linear"
VLLM_API: tuple[Seam, ...] = (
    # gdn.py: the GDN layer's metadata, forward context, state shapes and dtypes, conv kernels, layers.
    Seam("vllm.v1.attention.backends.gdn_attn", "GDNAttentionMetadata",
         fields=("num_actual_tokens", "num_decodes", "num_decode_tokens", "num_prefills",
                 "non_spec_state_indices_tensor", "non_spec_query_start_loc", "has_initial_state")),
    Seam("vllm.forward_context", "get_forward_context", ()),
    Seam("vllm.forward_context", "ForwardContext", fields=("attn_metadata", "no_compile_layers")),
    Seam("vllm._custom_ops", "causal_conv1d_update_cpu",
         keywords=("x", "conv_states", "weight", "bias", "silu_activation", "conv_state_indices", "is_weight_packed")),
    Seam("vllm._custom_ops", "causal_conv1d_fwd_cpu",
         keywords=("x", "weight", "bias", "conv_states", "query_start_loc", "cache_indices", "has_initial_state",
                   "silu_activation", "is_weight_packed")),
    Seam(f"{_GDN}.mamba_utils", "MambaStateShapeCalculator.gated_delta_net_state_shape",
         ("tp_world_size", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_kernel_size", "num_spec")),
    Seam(f"{_GDN}.mamba_utils", "MambaStateDtypeCalculator.gated_delta_net_state_dtype",
         ("model_dtype", "mamba_cache_dtype", "mamba_ssm_cache_dtype")),
    Seam(f"{_GDN}.mamba_utils", "MambaStateCopyFuncCalculator.gated_delta_net_state_copy_func", ()),
    Seam(f"{_GDN}.mamba_utils", "is_conv_state_dim_first", ()),
    Seam(f"{_GDN}.gdn.base", "GatedDeltaNetAttention.__init__", ("self", "config", "vllm_config", "prefix")),
    Seam("vllm.config", "CacheConfig", fields=("block_size", "mamba_cache_dtype", "mamba_ssm_cache_dtype")),
    Seam("vllm.config", "CompilationConfig", fields=("static_forward_context",)),
    Seam("vllm.config", "ModelConfig", fields=("dtype", "hf_text_config", "architecture")),
    Seam("vllm.config", "get_current_vllm_config", ()),
    Seam("vllm.platforms.interface", "Platform.is_cpu", ("self",)),
    Seam("vllm.utils.torch_utils", "direct_register_custom_op", ("op_name", "op_func"),
         keywords=("mutates_args", "fake_impl")),
    Seam("vllm.model_executor.utils", "set_weight_attrs", ("weight", "weight_attrs")),
    Seam("vllm.model_executor.layers.layernorm", "RMSNormGated.__init__", ("self", "hidden_size", "eps"),
         keywords=("norm_before_gate",)),
    Seam("vllm.model_executor.layers.layernorm", "RMSNorm.__init__", ("self", "hidden_size", "eps")),
    Seam(_LINEAR, "MergedColumnParallelLinear.__init__", ("self", "input_size", "output_sizes", "bias"),
         keywords=("quant_config", "prefix")),
    Seam(_LINEAR, "ColumnParallelLinear.__init__", ("self", "input_size", "output_size", "bias"),
         keywords=("quant_config", "prefix")),
    Seam(_LINEAR, "ReplicatedLinear.__init__", ("self", "input_size", "output_size", "bias"),
         keywords=("quant_config", "prefix")),
    Seam(_LINEAR, "RowParallelLinear.__init__", ("self", "input_size", "output_size", "bias"),
         keywords=("quant_config", "prefix")),
    # mla.py: vLLM's paged attention and rotary embedding.
    Seam("vllm.model_executor.layers.attention", "Attention.__init__", ("self", "num_heads", "head_size", "scale"),
         keywords=("num_kv_heads", "cache_config", "quant_config", "prefix")),
    Seam("vllm.model_executor.layers.rotary_embedding", "get_rope", ("head_size",),
         keywords=("max_position", "is_neox_style", "rope_parameters", "dtype")),
    # latent_mla.py: a layer with its own page layout, backend and metadata builder on vLLM's generic interfaces;
    # arch_config.py: the head size vLLM reads from the config. The block alignment asks the first attention
    # backend's customize_spec what a token costs (Platform._align_hybrid_block_size).
    Seam("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase",
         fields=("get_attn_backend", "get_kv_cache_spec", "bind_kv_cache")),
    Seam("vllm.v1.attention.backend", "AttentionBackend",
         fields=("get_name", "get_builder_cls", "get_supported_kernel_block_sizes", "customize_spec",
                 "full_cls_name")),
    Seam("vllm.v1.attention.backend", "AttentionMetadataBuilder.__init__",
         ("self", "kv_cache_spec", "layer_names", "vllm_config", "device")),
    Seam("vllm.v1.attention.backend", "AttentionMetadataBuilder.build",
         ("self", "common_prefix_len", "common_attn_metadata", "fast_build")),
    Seam("vllm.v1.attention.backend", "CommonAttentionMetadata",
         fields=("query_start_loc_cpu", "seq_lens", "num_reqs", "num_actual_tokens", "block_table_tensor",
                 "slot_mapping")),
    Seam("vllm.v1.attention.backend", "MultipleOf"),
    Seam("vllm.v1.attention.backends.utils", "split_decodes_and_prefills",
         ("common_attn_metadata", "decode_threshold")),
    Seam("vllm.v1.kv_cache_interface", "FullAttentionSpec",
         fields=("block_size", "num_kv_heads", "head_size", "head_size_v", "dtype", "page_size_padded")),
    Seam("vllm.platforms.interface", "Platform._align_hybrid_block_size", ("vllm_config", "backend_cls"),
         source_sha256={"0.32.0": "a728408b016f5b235b5fb2731a03cdb589dcfeeeb5d90a0e3476d89996014377",
                        "0.33.0": "e71decc57e98f69b6807f8826beabb261d433a1ae679cce2b9fdc2b01f10ff05"}),
    Seam("vllm.transformers_utils.model_arch_config_convertor", "MODEL_ARCH_CONFIG_CONVERTORS"),
    Seam("vllm.transformers_utils.model_arch_config_convertor", "ModelArchConfigConvertorBase.get_head_size",
         ("self",)),
    Seam("vllm.envs", "VLLM_MLA_DISABLE"),
    Seam("vllm.config", "VllmConfig", fields=("lora_config",)),
    # model.py and register(): the model's building blocks and the registry.
    Seam("vllm.model_executor.layers.vocab_parallel_embedding", "ParallelLMHead.__init__",
         ("self", "num_embeddings", "embedding_dim"), keywords=("prefix",)),
    Seam("vllm.model_executor.layers.vocab_parallel_embedding", "VocabParallelEmbedding.__init__",
         ("self", "num_embeddings", "embedding_dim")),
    Seam("vllm.model_executor.layers.logits_processor", "LogitsProcessor.__init__", ("self", "vocab_size")),
    Seam("vllm.model_executor.models.utils", "extract_layer_index", ("layer_name",)),
    Seam("vllm.model_executor.models.utils", "maybe_prefix", ("prefix", "name")),
    Seam("vllm.model_executor.model_loader.weight_utils", "default_weight_loader", ("param", "loaded_weight")),
    Seam("vllm", "ModelRegistry", fields=("register_model", "get_supported_archs")),
    # startup.py / runner.py: the engine's dtype and which model runner vLLM chose.
    Seam("vllm.config", "VllmConfig", fields=("model_config", "use_v2_model_runner")),
    Seam("vllm.triton_utils", "HAS_TRITON"),
    # seams.py fix 3: how the KV cache describes its groups.
    Seam("vllm.v1.kv_cache_interface", "MambaSpec", fields=("block_size",)),
    Seam("vllm.v1.kv_cache_interface", "KVCacheGroupSpec", fields=("kv_cache_spec",)),
    Seam("vllm.v1.kv_cache_interface", "KVCacheConfig", fields=("kv_cache_groups",)),
)  # fmt: skip


def install() -> None:
    """Apply the fixes (idempotent: each process's plugin load calls it once or more); a drifted record is
    logged and the fix still applied (``tests_vllm/test_vllm_seams.py`` is where drift fails)."""
    for name in dict.fromkeys(seam.module for seam in VLLM_SEAMS):
        install_seams(VLLM_SEAMS, importlib.import_module(name), hint=HINT, warn=logger.warning)

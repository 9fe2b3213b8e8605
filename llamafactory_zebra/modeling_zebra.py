"""Zebra hybrid decoder (Qwen3 blocks with MLA or Gated DeltaNet token mixers) for transformers.

Module names and parameter shapes follow AMD's released checkpoints (``model.layers.{i}.mla.*`` /
``model.layers.{i}.gdn.*``, Qwen3's MLP and norms, untied ``lm_head``), so their safetensors load with
no key mapping.

Packed batches never leak across samples: when ``position_ids`` restart inside a row (LLaMA-Factory's
``packing``), when the 2-D attention mask carries segment ids 1, 2, 3… (``neat_packing``), or when a
4-D block-diagonal mask is given, ``ZebraModel.forward`` derives per-sample segments once (the rule
lives in ``packing.py``) and ``layers/mixer_inputs.py`` hands them to both mixers — as ``cu_seqlens``
to the GDN recurrence and convolutions, and to MLA as the same borders (FlashAttention's varlen path,
or PyTorch's own kernels for sdpa: ``ops/packed_attention.py``) or, for eager, a block-diagonal mask.
The decode cache is ``cache_zebra.py``'s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache
from transformers.generation import GenerationMixin
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, dynamic_rope_update
from transformers.modeling_utils import PreTrainedModel
from transformers.utils import can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from .cache_zebra import GatedDeltaNetCacheLayer, ZebraHybridCache
from .configuration_zebra import MLA, ZebraConfig
from .kernels import Call, Key, Op, detect_stack, select
from .layers.gated_deltanet import ZebraGatedDeltaNet, ZebraShortConv, gdn_decay_init
from .layers.mixer_inputs import mixer_inputs, sample_borders
from .layers.mla import ZebraMLA
from .layers.norms import ZebraRMSNorm
from .layers.tiled_mlp import AUTO, set_mlp_tiles, tiled_mlp_forward
from .loss import fused_causal_lm_loss
from .quantization import keep_unfit_linears_out_of_4bit, wants_bnb_4bit
from .released import RELEASED_LAYOUT, checkpoint_layout, load_released_config
from .released.keys import check_loaded_weights


class ZebraMLP(nn.Module):
    def __init__(self, config: ZebraConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]
        # Sequence tiles for training forwards (``None``: off, ``AUTO``: one hidden size of tokens each).
        self.tiles: int | None = None

    def dense_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tiles is None or not torch.is_grad_enabled():
            return self.dense_forward(x)
        return tiled_mlp_forward(self, x, self.tiles)


class ZebraRotaryEmbedding(nn.Module):
    """cos/sin for the ``qk_rope_head_dim`` rotary dims of MLA, with transformers' RoPE variants (YaRN…)."""

    inv_freq: torch.Tensor

    def __init__(self, config: ZebraConfig, device: torch.device | None = None) -> None:
        super().__init__()
        self.config = config
        self.max_seq_len_cached = config.max_position_embeddings
        self.original_max_seq_len = config.max_position_embeddings
        self.rope_type = config.rope_parameters.get("rope_type", "default")
        init_fn: Callable = ROPE_INIT_FUNCTIONS[self.rope_type] if self.rope_type != "default" else self._default
        inv_freq, self.attention_scaling = init_fn(config, device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)

    @staticmethod
    def _default(config: ZebraConfig, device: torch.device | None = None, seq_len: int | None = None):
        dim = config.qk_rope_head_dim
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
        return 1.0 / (config.rope_parameters["rope_theta"] ** exponents), 1.0

    compute_default_rope_parameters = _default

    @torch.no_grad()
    @dynamic_rope_update
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1).to(x.device)
        with torch.autocast(device_type=x.device.type if x.device.type != "mps" else "cpu", enabled=False):
            freqs = (inv_freq @ position_ids[:, None, :].float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = emb.cos() * self.attention_scaling
            sin = emb.sin() * self.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)


class ZebraDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: ZebraConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_type = config.layer_types[layer_idx]
        if self.layer_type == MLA:
            self.mla = ZebraMLA(config, layer_idx)
        else:
            self.gdn = ZebraGatedDeltaNet(config, layer_idx)
        self.mlp = ZebraMLP(config)
        self.input_layernorm = ZebraRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = ZebraRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        cu_seqlens: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        if self.layer_type == MLA:
            hidden_states, _ = self.mla(
                hidden_states,
                position_embeddings=position_embeddings,
                attention_mask=attention_mask,
                past_key_values=past_key_values,
                **kwargs,
            )
        else:
            hidden_states = self.gdn(
                hidden_states,
                cu_seqlens=cu_seqlens,
                padding_mask=padding_mask,
                past_key_values=past_key_values,
                sp_context=kwargs.get("sp_context"),
            )
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        return residual + hidden_states


class ZebraPreTrainedModel(PreTrainedModel):
    config_class = ZebraConfig
    config: ZebraConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["ZebraDecoderLayer"]
    _skip_keys_device_placement = "past_key_values"
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_attention_backend = True
    _is_stateful = True
    # ``output_hidden_states=True`` / ``output_attentions=True`` (argument or config) record through
    # transformers' own hooks (``capture_outputs`` on ``ZebraModel.forward``), as Qwen3-Next does:
    # hidden states are the embeddings + every layer's output, the last one replaced by the output of the
    # final norm; attentions are the weights each MLA layer returns, ``[B, heads, queries, keys]``, one per
    # MLA layer in layer order (GDN layers have no attention weights and add nothing).
    _can_record_outputs = {"hidden_states": ZebraDecoderLayer, "attentions": ZebraMLA}
    # GDN's per-head gate projections (``a_proj`` -> decay, ``b_proj`` -> beta: one output per GDN head, 6 in
    # the released models) keep their precision: fp32 when a model loads in fp16, and never quantised
    # (transformers' quantizers leave this list unconverted). Their errors pass through exp/softplus/sigmoid
    # into every step of the recurrence, and they hold 0.02% of the parameters. Patterns are name suffixes
    # ("gdn." keeps MLA's ``q_a_proj`` out of it). This is the one rule that keeps them out of 4-bit too;
    # which other linears a 4-bit load must keep, for the shapes bitsandbytes' kernel cannot take, is
    # ``quantization.py``'s rule (added per instance).
    _keep_in_fp32_modules = ["gdn.a_proj", "gdn.b_proj"]

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, config=None, **kwargs):
        """As transformers', with two Zebra rules.

        - A directory in AMD's released layout loads with the config ``released.load_released_config``
          translates (transformers would read its ``config.json`` as the Qwen3 it describes); keyword
          arguments that are config fields (``use_cache=False``…) go into that config, as they would
          into a native one.
        - Weights that do not match the layer plan are an error, not a warning: transformers would initialise
          a missing tensor at random (its common tests expect that of a missing ``lm_head.weight``), which
          for a checkpoint only shows up as a model that writes noise. The message names the keys and, for
          a missing head, the fix (``released.keys.check_loaded_weights``). An unexpected key under the Zebra's own
          modules (``model.``, ``lm_head.``: a layer the plan lacks) is refused too; one outside them
          belongs to a wrapper that saved into the same file (trl's value head, ``v_head.summary.*``), and is
          left to transformers, which reports it in the loading info and its load report, as for any model.
        """
        if config is None and checkpoint_layout(pretrained_model_name_or_path) == RELEASED_LAYOUT:
            fields = {field.name for field in dataclasses.fields(ZebraConfig)} - {"dtype"}
            overrides = {key: kwargs.pop(key) for key in list(kwargs) if key in fields}
            config = load_released_config(pretrained_model_name_or_path, **overrides)
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(
            pretrained_model_name_or_path, *args, config=config, output_loading_info=True, **kwargs
        )
        check_loaded_weights(pretrained_model_name_or_path, model, info)
        return (model, info) if want_info else model

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, ZebraGatedDeltaNet):
            A_log, dt_bias = gdn_decay_init(module.num_heads)
            init.copy_(module.A_log, A_log)
            init.copy_(module.dt_bias, dt_bias)
        elif isinstance(module, ZebraShortConv):
            # torch's own Conv1d default; the 0.02-normal of linear layers would mute the short convolutions.
            init.kaiming_uniform_(module.weight, a=math.sqrt(5))


class ZebraModel(ZebraPreTrainedModel):
    _keys_to_ignore_on_load_unexpected = [r"^lm_head\."]
    # ``parallel.enable_sequence_parallel`` looks for this flag (``parallel`` never imports the model).
    supports_sequence_parallel = True

    def __init__(self, config: ZebraConfig) -> None:
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList([ZebraDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = ZebraRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = ZebraRotaryEmbedding(config)
        self.gradient_checkpointing = False
        # A ``parallel.SequenceParallelLayout`` once ``parallel.enable_sequence_parallel`` ran: each forward
        # then sees one shard of every row and its mixers exchange what crosses shard borders.
        self.sequence_parallel = None
        self.post_init()

    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """``hidden_states`` (with ``output_hidden_states``) follow the tokens this call sees: the new tokens
        when decoding with a cache, this rank's shard of every row under sequence parallelism (as
        ``last_hidden_state`` and the logits do); packed rows need no special case, each position's states
        are those of its own sample.

        ``attentions`` (with ``output_attentions``, argument or config) hold one ``[B, heads, queries, keys]``
        map per MLA layer, over the keys this call reads (the cached ones too when decoding). Whatever
        ``attn_implementation`` is selected, a call that asks for them runs its MLA layers on eager attention
        (sdpa and FlashAttention form no weights; ``layers/mla.py``) or, when decoding from a cache, on the
        absorbed path, whose weights are exact. Packed rows then take the dense block-causal mask instead of
        the samples' borders: each sample's map is its own causal block, with zero weight across borders.
        Not with sequence parallelism (each rank holds a share of the heads of whole rows)."""
        inputs_embeds = self._embed(input_ids, inputs_embeds)
        output_attentions = bool(kwargs.pop("output_attentions", self.config.output_attentions))
        self._check_cache_and_sequence_parallel(past_key_values, position_ids, output_attentions)
        batch, length = inputs_embeds.shape[:2]
        if position_ids is None:
            past_seen = past_key_values.get_seq_length() if past_key_values is not None else 0
            position_ids = torch.arange(past_seen, past_seen + length, device=inputs_embeds.device)[None]
        position_ids = position_ids.expand(batch, -1)

        segment_ids, sp_context = sample_borders(self.sequence_parallel, attention_mask, position_ids, past_key_values)
        if past_key_values is None and segment_ids is None and self._wants_cache(use_cache):
            past_key_values = ZebraHybridCache(self.config)
        inputs = (inputs_embeds, attention_mask, position_ids, past_key_values, segment_ids, sp_context)
        per_mixer = mixer_inputs(self.config, *inputs, output_attentions)

        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                position_embeddings=position_embeddings,
                past_key_values=past_key_values,
                **{**kwargs, **per_mixer},
            )
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=past_key_values)

    def _embed(self, input_ids: torch.LongTensor | None, inputs_embeds: torch.FloatTensor | None) -> torch.Tensor:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds")
        return self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds

    def _check_cache_and_sequence_parallel(
        self, past_key_values: Cache | None, position_ids: torch.Tensor | None, output_attentions: bool
    ) -> None:
        if past_key_values is not None and not isinstance(past_key_values, ZebraHybridCache):
            raise TypeError(
                "Zebra models need a ZebraHybridCache (MLA latents + GDN states), "
                f"got {type(past_key_values).__name__}"
            )
        if self.sequence_parallel is not None and (past_key_values is not None or position_ids is None):
            raise ValueError(
                "with sequence parallelism the model needs the shard's position_ids "
                "(llamafactory_zebra.parallel.shard_batch) and cannot decode with a cache"
            )
        if self.sequence_parallel is not None and output_attentions:
            raise ValueError("output_attentions is not supported with sequence parallelism")

    def _wants_cache(self, use_cache: bool | None) -> bool:
        """A new cache for an unpacked, single-process forward that asked for one (inference by default)."""
        if self.sequence_parallel is not None:
            return False
        return use_cache if use_cache is not None else (self.config.use_cache and not self.training)


class ZebraForCausalLM(ZebraPreTrainedModel, GenerationMixin):
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}

    def __init__(self, config: ZebraConfig) -> None:
        super().__init__(config)
        self.model = ZebraModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.fused_cross_entropy: str | None = None
        self.post_init()
        if wants_bnb_4bit(getattr(config, "quantization_config", None)):
            keep_unfit_linears_out_of_4bit(self)  # transformers sets quantization_config before building

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        # A training loss computed from the final hidden states and the lm_head weight *inside* this forward
        # (distillation; see ``distill/``): ZeRO-3 gathers lm_head here, and DDP sees the whole graph.
        head_loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = kwargs.pop("head_loss_fn", None)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        if head_loss_fn is not None:
            loss = head_loss_fn(hidden_states, self.lm_head.weight)
            return CausalLMOutputWithPast(
                loss=loss,
                logits=None,
                past_key_values=outputs.past_key_values,
                hidden_states=outputs.hidden_states,
                attentions=outputs.attentions,
            )
        if self.fused_cross_entropy is not None and self.training and labels is not None:
            loss = fused_causal_lm_loss(
                hidden_states,
                self.lm_head.weight,
                labels,
                force=self._demanded_loss(),
                num_items_in_batch=kwargs.get("num_items_in_batch"),
                shift_labels=kwargs.get("shift_labels"),
            )
            return CausalLMOutputWithPast(
                loss=loss,
                logits=None,
                past_key_values=outputs.past_key_values,
                hidden_states=outputs.hidden_states,
                attentions=outputs.attentions,
            )
        slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, slice_indices, :])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )

    def enable_tiled_mlp(self, tiles: int = AUTO) -> None:
        """Run every MLP over sequence tiles in training (DeepSpeed's ``TiledMLP``; see ``layers/tiled_mlp.py``).

        ``tiles=0`` picks about one hidden size of tokens per tile. Exact: same loss and gradients. Works
        single-process and under DeepSpeed ZeRO; plain DDP is not supported (each tile's backward would
        report the MLP gradients ready again).
        """
        set_mlp_tiles(self, tiles)

    def enable_fused_cross_entropy(self, backend: str = "auto") -> str:
        """Compute the training loss from hidden states without full logits (see ``loss.py``).

        ``auto``: the kernel registry's ``loss`` op chooses at each training forward, from the hidden
        states' device (Liger's Triton kernel on a GPU with Liger installed, the chunked PyTorch function
        otherwise); ``liger`` or ``chunked`` demands one. Only training forwards with labels change; they
        return no logits. Returns what a forward on this machine's GPU (its CPU without one) will run.
        """
        if backend not in ("auto", Key.LIGER, Key.CHUNKED):
            raise ValueError(
                f"fused cross-entropy backend must be 'auto', {Key.LIGER!r} or {Key.CHUNKED!r}, got {backend!r}"
            )
        self.fused_cross_entropy = backend
        call = Call.on("cuda" if detect_stack().has_gpu else "cpu")
        return select(Op.LOSS, call, force=self._demanded_loss()).kernel.key

    def _demanded_loss(self) -> str | None:
        """``enable_fused_cross_entropy``'s demand, ``None`` for the registry's own choice."""
        return None if self.fused_cross_entropy == "auto" else self.fused_cross_entropy

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs) -> None:
        """transformers would build a ``DynamicCache`` from ``layer_types``; Zebra layers need their own."""
        if model_kwargs.get("past_key_values") is None and generation_config.use_cache is not False:
            model_kwargs["past_key_values"] = ZebraHybridCache(self.config)


__all__ = [
    "ZebraPreTrainedModel",
    "ZebraModel",
    "ZebraForCausalLM",
    "ZebraDecoderLayer",
    "ZebraHybridCache",
    "GatedDeltaNetCacheLayer",
]

"""The Zebra decode cache: per layer, the MLA latent and rope key, or the GDN layer's conv windows and recurrent state.

Its own module (as transformers keeps a model's cache classes apart from its layers when they are more than a
``DynamicCache``): ``ZebraModel`` builds one for a forward that wants a cache and ``generate`` builds one through
``ZebraForCausalLM._prepare_cache_for_generation``; the MLA layers read and grow their ``DynamicLayer`` and the GDN
layers replace their state after each step (``layers/gated_deltanet.py``).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer, LinearAttentionCacheLayerMixin

from .configuration_zebra import MLA, ZebraConfig


class GatedDeltaNetCacheLayer(LinearAttentionCacheLayerMixin):
    """Decode state of one GDN layer: the q/k/v convolution windows and the ``[B, H, dk, dv]`` recurrence.

    The three windows are kept in one tensor (channels concatenated) so transformers' generic cache
    operations — beam reordering, offloading, reset — handle them.
    """

    # States are replaced, not updated in place: no static addresses for torch.compile or cudagraphs.
    is_compileable = False

    def __init__(self, split_sizes: tuple[int, int, int]) -> None:
        super().__init__()
        # transformers >= 5.19's mixin keeps dicts of several states per layer; this layer keeps one of each.
        self.conv_states = self.recurrent_states = None
        self.is_conv_states_initialized = self.is_recurrent_states_initialized = self.has_previous_state = False
        self.split_sizes = split_sizes
        self.seen_tokens = 0

    def lazy_initialization(self, conv_states=None, recurrent_states=None) -> None:
        if conv_states is not None:
            self.conv_states = conv_states
            self.device = conv_states.device
            self.is_conv_states_initialized = True
        if recurrent_states is not None:
            self.recurrent_states = recurrent_states
            self.is_recurrent_states_initialized = True

    def update_conv_state(self, conv_states: torch.Tensor, **kwargs) -> torch.Tensor:
        self.lazy_initialization(conv_states=conv_states)
        return self.conv_states

    def update_recurrent_state(self, recurrent_states: torch.Tensor, **kwargs) -> torch.Tensor:
        self.lazy_initialization(recurrent_states=recurrent_states)
        return self.recurrent_states

    @property
    def conv_states_qkv(self) -> tuple[torch.Tensor | None, ...]:
        if not self.is_conv_states_initialized:
            return (None, None, None)
        return tuple(self.conv_states.split(self.split_sizes, dim=1))

    @property
    def recurrent_state(self) -> torch.Tensor | None:
        return self.recurrent_states

    def store(self, conv_states: list[torch.Tensor], recurrent_state: torch.Tensor, num_tokens: int) -> None:
        self.update_conv_state(torch.cat(conv_states, dim=1))
        self.update_recurrent_state(recurrent_state)
        self.seen_tokens += num_tokens
        self.has_previous_state = True

    def reset(self) -> None:
        for state in (self.conv_states, self.recurrent_states):
            if state is not None:
                state.zero_()
        self.has_previous_state = False
        self.seen_tokens = 0


class ZebraHybridCache(Cache):
    """Per layer: the MLA latent and rope key (a ``DynamicLayer`` with one "head"), or the GDN state."""

    def __init__(self, config: ZebraConfig) -> None:
        layers = []
        key_dim = config.gdn_num_heads * config.gdn_head_dim
        value_dim = config.gdn_num_heads * config.gdn_head_v_dim
        for layer_type in config.layer_types:
            if layer_type == MLA:
                layers.append(DynamicLayer())
            else:
                layers.append(GatedDeltaNetCacheLayer((key_dim, key_dim, value_dim)))
        super().__init__(layers=layers)
        self.layer_types = list(config.layer_types)

    def gdn_layer(self, layer_idx: int) -> GatedDeltaNetCacheLayer:
        return self.layers[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        if MLA in self.layer_types:
            return super().get_seq_length(layer_idx if self.layer_types[layer_idx] == MLA else 0)
        return self.layers[0].seen_tokens

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        if self.layer_types[layer_idx] != MLA:
            layer_idx = self.layer_types.index(MLA) if MLA in self.layer_types else layer_idx
            if self.layer_types[layer_idx] != MLA:
                return query_length + self.get_seq_length(), 0
        return super().get_mask_sizes(query_length, layer_idx)

    def bytes_per_token(self) -> int:
        """Bytes the MLA layers add per cached token (the GDN state does not grow with length)."""
        total = 0
        for layer in self.layers:
            if isinstance(layer, DynamicLayer) and layer.is_initialized:
                total += (layer.keys.shape[-1] + layer.values.shape[-1]) * layer.keys.element_size()
        return total

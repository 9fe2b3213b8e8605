"""Gated DeltaNet token mixer with the parameter names of the released Zebra GDN layers.

Layout of fla's ``GatedDeltaNet`` defaults (use_gate, short conv of width 4 without bias, no negative
eigenvalues): q/k/v projections each followed by a depthwise causal convolution and SiLU, per-head
write strength ``beta`` and log-decay ``g`` from ``b_proj(x)``, ``a_proj(x)``, ``A_log`` and ``dt_bias``
(``ops.gdn_gates`` has the formula), the gated delta rule over L2-normalised q/k, then a gated RMSNorm
(gate ``g_proj(x)``) and ``o_proj``.

The math lives in ``llamafactory_zebra.ops``; this module wires parameters, packing borders and the
decode cache to it. Under sequence parallelism (``sp_context``: the rows are shards of longer rows) the
layer makes the one switch in :meth:`ZebraGatedDeltaNet.forward` where a shard differs from a whole row:
the convolutions' entering windows come from the previous rank (``parallel.gdn.conv_halo_states``,
an exchange of the layer's own q/k/v projections, so it cannot be handed in before the layer runs) and
the rule is ``parallel.gdn.chunk_gated_delta_rule_sp``, which takes the recurrence's entering state from
the earlier ranks — as the MLA layer wraps its attention function for Ulysses.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from ..configuration_zebra import ZebraConfig
from ..ops import (
    causal_conv1d,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
    gdn_gates,
)
from ..parallel.gdn import chunk_gated_delta_rule_sp, conv_halo_states
from .norms import ZebraGatedRMSNorm

# fla's defaults for the decay parametrisation: dt ~ logUniform(dt_min, dt_max), floored, A ~ U(0, 16).
DT_MIN, DT_MAX, DT_FLOOR = 0.001, 0.1, 1e-4
A_INIT_RANGE = (0.0, 16.0)


def gdn_decay_init(num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's initialisation of the decay: ``A ~ U(0, 16)`` and ``dt_bias = softplus⁻¹(dt)``."""
    A_log = torch.empty(num_heads).uniform_(*A_INIT_RANGE).log()
    dt = torch.exp(torch.rand(num_heads) * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN))
    dt = dt.clamp(min=DT_FLOOR)
    return A_log, dt + torch.log(-torch.expm1(-dt))


class ZebraShortConv(nn.Conv1d):
    """Depthwise causal convolution stored as ``nn.Conv1d`` (weight ``[C, 1, W]``, the released key layout)."""

    def __init__(self, channels: int, kernel_size: int) -> None:
        super().__init__(channels, channels, kernel_size, groups=channels, padding=kernel_size - 1, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cu_seqlens: torch.Tensor | None = None,
        state: torch.Tensor | None = None,
        output_final_state: bool = False,
        decoding: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        weight = self.weight.squeeze(1)
        if decoding and x.shape[1] == 1:
            return causal_conv1d_update(x, state, weight, activation="silu")
        return causal_conv1d(
            x,
            weight,
            activation="silu",
            initial_state=state,
            output_final_state=output_final_state,
            cu_seqlens=cu_seqlens,
        )


class ZebraGatedDeltaNet(nn.Module):
    def __init__(self, config: ZebraConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.gdn_num_heads
        self.head_k_dim = config.gdn_head_dim
        self.head_v_dim = config.gdn_head_v_dim
        self.key_dim = self.num_heads * self.head_k_dim
        self.value_dim = self.num_heads * self.head_v_dim
        hidden = config.hidden_size

        self.q_proj = nn.Linear(hidden, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.value_dim, bias=False)
        self.a_proj = nn.Linear(hidden, self.num_heads, bias=False)
        self.b_proj = nn.Linear(hidden, self.num_heads, bias=False)
        self.A_log = nn.Parameter(torch.empty(self.num_heads))
        self.dt_bias = nn.Parameter(torch.empty(self.num_heads))
        self.q_conv1d = ZebraShortConv(self.key_dim, config.gdn_conv_size)
        self.k_conv1d = ZebraShortConv(self.key_dim, config.gdn_conv_size)
        self.v_conv1d = ZebraShortConv(self.value_dim, config.gdn_conv_size)
        self.g_proj = nn.Linear(hidden, self.value_dim, bias=False)
        self.o_norm = ZebraGatedRMSNorm(self.head_v_dim, eps=config.gdn_norm_eps)
        self.o_proj = nn.Linear(self.value_dim, hidden, bias=False)
        with torch.no_grad():
            A_log, dt_bias = gdn_decay_init(self.num_heads)
            self.A_log.copy_(A_log)
            self.dt_bias.copy_(dt_bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        cu_seqlens: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        past_key_values=None,
        sp_context=None,
        **kwargs,
    ) -> torch.Tensor:
        """``cu_seqlens`` marks packed-sample borders over the flattened batch; ``padding_mask`` (``[B, T]``,
        1 = token) zeroes padded positions before the convolutions so left padding cannot reach the state.
        ``sp_context`` (a ``parallel.SequenceParallelContext``): the rows are shards of longer rows; the
        convolution halo and the recurrence's entering state come from the earlier ranks."""
        batch, length, _ = hidden_states.shape
        cache = past_key_values.gdn_layer(self.layer_idx) if past_key_values is not None else None
        decoding = cache is not None and cache.has_previous_state
        if cu_seqlens is not None and cache is not None:
            raise ValueError("Packed sequences (cu_seqlens) cannot be combined with a decode cache")

        if padding_mask is not None:
            hidden_states = hidden_states * padding_mask[..., None].to(hidden_states.dtype)
        mixed = (self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states))
        if cu_seqlens is not None:
            mixed = tuple(x.reshape(1, batch * length, -1) for x in mixed)

        # What enters the convolutions and the recurrence: the cache's states, or the earlier ranks'.
        conv_states = cache.conv_states_qkv if cache is not None else (None, None, None)
        rule = fused_recurrent_gated_delta_rule if decoding and length == 1 else chunk_gated_delta_rule
        if sp_context is not None:
            conv_states = conv_halo_states(sp_context, mixed, self.q_conv1d.kernel_size[0])
            rule = functools.partial(chunk_gated_delta_rule_sp, sp_context)

        (q, k, v), new_conv_states = self.short_convolutions(
            mixed, conv_states, cu_seqlens, keep_states=cache is not None, decoding=decoding
        )
        g, beta = self.gates(hidden_states)
        if cu_seqlens is not None:
            beta = beta.reshape(1, batch * length, -1)
            g = g.reshape(1, batch * length, -1)
        output, recurrent_state = rule(
            q,
            k,
            v,
            g=g,
            beta=beta,
            initial_state=cache.recurrent_state if decoding else None,
            output_final_state=cache is not None,
            cu_seqlens=cu_seqlens,
            use_qk_l2norm_in_kernel=True,
        )
        if cache is not None:
            cache.store(new_conv_states, recurrent_state, num_tokens=length)

        output = output.reshape(batch, length, self.num_heads, self.head_v_dim)
        gate = self.g_proj(hidden_states).unflatten(-1, (self.num_heads, self.head_v_dim))
        output = self.o_norm(output, gate)
        return self.o_proj(output.reshape(batch, length, self.value_dim))

    def short_convolutions(
        self,
        mixed: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        conv_states: tuple[torch.Tensor | None, ...],
        cu_seqlens: torch.Tensor | None,
        keep_states: bool,
        decoding: bool,
    ) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], list[torch.Tensor | None]]:
        """q, k, v ``[B, T, heads, ·]`` after their causal convolutions and SiLU, and each convolution's
        final window (when ``keep_states``, for the cache)."""
        outputs, new_states = [], []
        for conv, x, state in zip((self.q_conv1d, self.k_conv1d, self.v_conv1d), mixed, conv_states, strict=True):
            y, new_state = conv(
                x, cu_seqlens=cu_seqlens, state=state, output_final_state=keep_states, decoding=decoding
            )
            outputs.append(y)
            new_states.append(new_state)
        q, k, v = outputs
        q = q.unflatten(-1, (self.num_heads, self.head_k_dim))
        k = k.unflatten(-1, (self.num_heads, self.head_k_dim))
        v = v.unflatten(-1, (self.num_heads, self.head_v_dim))
        return (q, k, v), new_states

    def gates(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The log-decay ``g`` (fp32) and write strength ``beta`` (the activations' dtype) ``[B, T, heads]``.

        The gate projections may be kept in fp32 while the rest runs in fp16 (``_keep_in_fp32_modules``).
        """
        gate_input = hidden_states.to(self.b_proj.weight.dtype)
        g, beta = gdn_gates(self.a_proj(gate_input), self.b_proj(gate_input), self.A_log, self.dt_bias)
        return g, beta.to(hidden_states.dtype)

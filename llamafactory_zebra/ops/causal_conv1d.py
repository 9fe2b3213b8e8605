"""Short causal depthwise convolution (GDN's q/k/v conv) with packed-sample borders and a decode state.

``torch.nn.functional.conv1d`` neither resets at packed-sample borders nor carries a decode state, and
fla's ``causal_conv1d`` needs a GPU; this is the PyTorch path with fla's contract, and fla's kernel where
the kernel registry (``kernels/registry.py``, op ``conv``) chooses it: this module binds each entry's function
for whole sequences (entry point ``sequence``) and for decode steps (``step``), at its end.

State layout (fla's ``fla.modules.causal_conv1d`` / formerly ``fla.modules.convolution``): a
``[N, D, W]`` tensor holding the last ``W`` inputs of each sequence, oldest first, newest at
``[..., -1]``. Only the newest ``W - 1`` columns are ever read (the next output's window is those plus
the new token); column 0 is kept so that the same cache works with fla's kernels. A sequence shorter
than ``W`` fills the missing columns from its initial state (zeros without one).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels import Call, EntryPoint, Key, Op, bind, run
from .backend import fla_function
from .recompute import recomputed
from .segments import check_cu_seqlens_layout, segment_bounds

_FLA_CONV = ("fla.modules.causal_conv1d", "fla.modules.convolution")
_ACTIVATIONS = (None, "silu", "swish")


def _check_conv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None, token_shape: str
) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor of shape {token_shape}.")
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2 or weight.shape[0] != x.shape[-1]:
        got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must have shape [D, W] with D = {x.shape[-1]} (x's last dim), got {got}.")
    if bias is not None and tuple(bias.shape) != (x.shape[-1],):
        raise ValueError(f"bias must have shape [D] = ({x.shape[-1]},), got {tuple(bias.shape)}.")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {activation!r}.")


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    return y if activation is None else F.silu(y)


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``y_t = act(bias + sum_w weight[:, w] * x_{t - W + 1 + w})`` per channel, within each sequence.

    Args:
        x: ``[B, T, D]``; with ``cu_seqlens`` B must be 1 and T is the packed length.
        weight: ``[D, W]`` (``nn.Conv1d(D, D, W, groups=D).weight.squeeze(1)``). bias: ``[D]`` or None.
        activation: ``"silu"`` (alias ``"swish"``) or ``None``.
        initial_state: ``[N, D, W]`` (see module doc), N = B or ``len(cu_seqlens) - 1``; the inputs
            "before" each sequence. Zeros when ``None``.
        output_final_state: also return the ``[N, D, W]`` state after each sequence, in x's dtype.
        cu_seqlens: ``[N + 1]`` borders of packed samples; windows never reach across a border.

    Returns ``(y [B, T, D] in x's dtype, final_state or None)``.
    """
    _check_conv(x, weight, bias, activation, "[B, T, D]")
    if x.ndim != 3:
        raise ValueError(f"x must have shape [B, T, D], got {tuple(x.shape)}.")
    check_cu_seqlens_layout(cu_seqlens, x.shape[0])
    num_seqs = x.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    width = weight.shape[1]
    if initial_state is not None and tuple(initial_state.shape) != (num_seqs, x.shape[2], width):
        raise ValueError(
            f"initial_state must have shape [N, D, W] = {(num_seqs, x.shape[2], width)}, "
            f"got {tuple(initial_state.shape)}."
        )

    return run(
        Op.CONV,
        Call.of(x),
        x,
        weight,
        bias,
        activation,
        initial_state,
        output_final_state,
        cu_seqlens,
        entry_point=EntryPoint.SEQUENCE,
    )


def _causal_conv1d_fla(x, weight, bias, activation, initial_state, output_final_state, cu_seqlens):
    return fla_function(_FLA_CONV, "causal_conv1d")(
        x=x,
        weight=weight,
        bias=bias,
        initial_state=initial_state,
        output_final_state=output_final_state,
        activation=activation,
        cu_seqlens=None if cu_seqlens is None else cu_seqlens.to(torch.int64),
    )


def _causal_conv1d_torch(x, weight, bias, activation, initial_state, output_final_state, cu_seqlens):
    """The convolution over the packed tokens in place, one multiply-add per tap; then the few outputs whose
    window starts before their sequence (its first ``W - 1`` tokens, which the shifted taps read from the
    previous sequence) computed again from their own sequence's history.

    That costs ``W`` passes over the tokens and ``N * (W - 1)`` corrected rows, where laying each sequence out
    behind its own history first costs two gathers of every token and a temporary per tap (about three times
    slower on a CPU, docs/benchmarks.md). Training calls (no final state) keep only x for backward and run
    the convolution again there (``recompute.py``), not the pre-activation output (another copy of x in fp32).
    """
    if not output_final_state:
        return recomputed(_causal_conv1d_torch_output, x, weight, bias, activation, initial_state, cu_seqlens), None
    return _causal_conv1d_torch_pass(x, weight, bias, activation, initial_state, output_final_state, cu_seqlens)


def _causal_conv1d_torch_output(x, weight, bias, activation, initial_state, cu_seqlens):
    return _causal_conv1d_torch_pass(x, weight, bias, activation, initial_state, False, cu_seqlens)[0]


def _causal_conv1d_torch_pass(x, weight, bias, activation, initial_state, output_final_state, cu_seqlens):
    batch, seq_len, channels = x.shape
    width = weight.shape[1]
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    starts, lengths = segment_bounds(batch, seq_len, cu_seqlens)
    num_seqs, num_tokens = len(starts), batch * seq_len

    tokens = x.reshape(num_tokens, channels).to(dtype)
    if initial_state is None:
        history = tokens.new_zeros(num_seqs, width, channels)
    else:
        history = initial_state.to(dtype).transpose(1, 2)  # [N, W, D], oldest first
    taps = weight.to(dtype).t()  # [W, D]: taps[-1] weighs the current input, taps[-1 - s] the one s back

    out = tokens * taps[-1]
    for back in range(1, width):
        out[back:].addcmul_(tokens[:-back], taps[-1 - back])
    seq, last = _border_rows(lengths, width)
    if len(seq):
        rows = (starts[seq] + last).to(x.device)
        out.index_copy_(0, rows, (_windows(tokens, history, starts, seq, last, width) * taps).sum(1))
    if bias is not None:
        out = out + bias.to(dtype)
    y = _activate(out, activation).view(batch, seq_len, channels).to(x.dtype)
    if not output_final_state:
        return y, None
    everything = torch.arange(num_seqs)
    final = _windows(tokens, history, starts, everything, lengths - 1, width)
    return y, final.transpose(1, 2).to(x.dtype)


def _border_rows(lengths: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sequence, position)`` of every token among the first ``W - 1`` of its sequence (CPU int64)."""
    positions = torch.arange(width - 1)
    present = positions[None, :] < lengths[:, None]
    seq, last = present.nonzero(as_tuple=True)
    return seq, positions[last]


def _windows(tokens, history, starts, seq, last, width) -> torch.Tensor:
    """``[K, W, D]``: the ``W`` inputs (oldest first) of the windows ending at position ``last[k]`` of
    sequence ``seq[k]`` (``-1``: before its first token), read from its tokens and, before them, its history."""
    relative = last[:, None] - (width - 1) + torch.arange(width)  # [K, W]
    if tokens.shape[0] == 0:
        return history[seq[:, None], width + relative]
    device = tokens.device
    from_tokens = (relative >= 0).to(device)[..., None]
    own = tokens[(starts[seq][:, None] + relative).clamp(min=0).to(device)]
    before = history[seq[:, None].to(device), (width + relative).clamp(max=width - 1).to(device)]
    return torch.where(from_tokens, own, before)


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step: shift ``x`` (``[N, D]`` or ``[N, 1, D]``) into ``conv_state`` ``[N, D, W]``.

    ``conv_state`` is updated in place (as fla's kernel does) and returned with the output, which has
    x's shape and dtype. For several new tokens use :func:`causal_conv1d` with ``initial_state``.
    """
    _check_conv(x, weight, bias, activation, "[N, D] or [N, 1, D]")
    if not (x.ndim == 2 or (x.ndim == 3 and x.shape[1] == 1)):
        raise ValueError(
            f"x must have shape [N, D] or [N, 1, D] (one token per sequence), got {tuple(x.shape)}; "
            "use causal_conv1d(..., initial_state=conv_state) for several tokens."
        )
    expected = (x.shape[0], x.shape[-1], weight.shape[1])
    if not isinstance(conv_state, torch.Tensor) or tuple(conv_state.shape) != expected:
        got = tuple(conv_state.shape) if isinstance(conv_state, torch.Tensor) else type(conv_state).__name__
        raise ValueError(f"conv_state must have shape [N, D, W] = {expected}, got {got}.")

    return run(Op.CONV, Call.of(x), x, conv_state, weight, bias, activation, entry_point=EntryPoint.STEP)


def _causal_conv1d_update_fla(x, conv_state, weight, bias, activation):
    update = fla_function(_FLA_CONV, "causal_conv1d_update")
    return update(x=x, cache=conv_state, weight=weight, bias=bias, activation=activation)


def _causal_conv1d_update_torch(x, conv_state, weight, bias, activation):
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    token = x.reshape(x.shape[0], x.shape[-1]).to(dtype)
    window = torch.cat([conv_state[..., 1:].to(dtype), token[..., None]], dim=-1)
    y = (window * weight.to(dtype)).sum(-1)
    if bias is not None:
        y = y + bias.to(dtype)
    conv_state.copy_(window)
    return _activate(y, activation).view(x.shape).to(x.dtype), conv_state


def causal_conv1d_in_slots(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_cache: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """:func:`causal_conv1d` over packed prompt chunks whose windows live in slots of a serving cache.

    ``x``: ``[1, T, D]`` packed along T by ``cu_seqlens`` (``[N + 1]``); segment ``i`` continues from slot
    ``conv_cache[state_indices[i]]`` (zeros where ``has_initial_state[i]`` is false) and leaves its last
    ``W - 1`` inputs there. ``conv_cache``: ``[slots, D, W - 1]``, any strides (a serving engine keeps the
    ``W - 1`` inputs a window reads; this module's state also keeps the oldest, unread one, so it is padded
    for the call). Returns ``y`` ``[1, T, D]`` in x's dtype.
    """
    _check_conv_cache(conv_cache, x, weight)
    state = F.pad(conv_cache[state_indices], [1, 0])
    state[~has_initial_state] = 0
    y, final = causal_conv1d(
        x, weight, activation=activation, initial_state=state, output_final_state=True, cu_seqlens=cu_seqlens
    )
    conv_cache[state_indices] = final[..., 1:].to(conv_cache.dtype)
    return y


def causal_conv1d_update_in_slots(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_cache: torch.Tensor,
    state_indices: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """:func:`causal_conv1d_update` for ``x`` ``[N, D]`` (one token of each of N sequences) whose windows
    live in slots ``state_indices`` of ``conv_cache`` ``[slots, D, W - 1]`` (see
    :func:`causal_conv1d_in_slots`); the slots are advanced. Returns ``y`` ``[N, D]`` in x's dtype."""
    _check_conv_cache(conv_cache, x, weight)
    state = F.pad(conv_cache[state_indices], [1, 0])
    y, state = causal_conv1d_update(x, state, weight, activation=activation)
    conv_cache[state_indices] = state[..., 1:].to(conv_cache.dtype)
    return y


def _check_conv_cache(conv_cache: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    expected = (x.shape[-1], weight.shape[-1] - 1)
    if not isinstance(conv_cache, torch.Tensor) or conv_cache.ndim != 3 or tuple(conv_cache.shape[1:]) != expected:
        got = tuple(conv_cache.shape) if isinstance(conv_cache, torch.Tensor) else type(conv_cache).__name__
        raise ValueError(f"conv_cache must have shape [slots, D, W - 1] with D, W - 1 = {expected}, got {got}.")


bind(Op.CONV, {Key.FLA: _causal_conv1d_fla, Key.TORCH: _causal_conv1d_torch}, EntryPoint.SEQUENCE)
bind(Op.CONV, {Key.FLA: _causal_conv1d_update_fla, Key.TORCH: _causal_conv1d_update_torch}, EntryPoint.STEP)

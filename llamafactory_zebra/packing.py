"""The no-leakage rule: where the packed samples of a batch start and end, and what each mixer reads.

LLaMA-Factory hands a model its packed rows in one of three forms: ``packing`` restarts
``position_ids`` at 0 for every sample (padding gets position 0 too); ``neat_packing`` also numbers the
samples 1, 2, 3… in the 2-D ``attention_mask`` (0 = padding); a collator with ``block_diag_attn`` may
send a 4-D block-diagonal mask instead. This module turns each form into one ``[B, T]`` tensor of
segment ids, and segment ids into what the mixers read: ``cu_seqlens`` over the flattened ``B * T``
tokens (GDN recurrence and convolutions), FlashAttention's varlen arguments (``flash_varlen_kwargs``),
a block-causal boolean mask (sdpa/eager) and RoPE positions restarting per sample. The
single-process model, sequence parallelism (which applies the same rule to whole rows gathered from
their shards) and the distillation teacher all call it, so they isolate exactly the same tokens.

Why not transformers' or LLaMA-Factory's helpers: transformers derives packed borders only inside its
FlashAttention path (from ``position_ids``, for attention), and LLaMA-Factory's
``model_utils.packing.get_unpad_data`` drops padding from ``cu_seqlens`` — the GDN ops take every
token, so padding has to be a segment of its own. Every function has a worked example (run as a test).
"""

from __future__ import annotations

import torch


def _check_rows(name: str, values: torch.Tensor) -> torch.Tensor:
    if not isinstance(values, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(values).__name__}.")
    if values.is_floating_point() or values.is_complex():
        raise ValueError(f"{name} must hold integers, got {values.dtype}.")
    if values.ndim == 1:
        values = values[None]
    if values.ndim != 2 or values.shape[1] == 0:
        raise ValueError(f"{name} must have shape [B, T] or [T] with T > 0, got {tuple(values.shape)}.")
    return values


def sample_starts_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool, True where a sample begins: each row start, and wherever the position does not
    continue the previous one (``p_t != p_{t-1} + 1``: LLaMA-Factory's restart at 0, or a jump).

    >>> sample_starts_from_position_ids(torch.tensor([[0, 1, 2, 0, 1, 0, 0]])).int().tolist()
    [[1, 0, 0, 1, 0, 1, 1]]
    """
    position_ids = _check_rows("position_ids", position_ids)
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    return starts


def segment_starts(segment_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool, True at each row start and wherever the id changes along the row.

    >>> segment_starts(torch.tensor([[1, 1, 2, 2, 2, 0], [0, 0, 1, 1, 1, 1]])).int().tolist()
    [[1, 0, 1, 0, 0, 1], [1, 0, 1, 0, 0, 0]]
    """
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    return starts


def run_ids(segment_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` ids 1, 2, 3… per maximal stretch of one segment id; each padding stretch is a run too.

    >>> run_ids(torch.tensor([[0, 1, 1, 2, 0, 0]])).tolist()
    [[1, 2, 2, 3, 4, 4]]
    """
    return segment_starts(segment_ids).long().cumsum(-1)


def segment_ids_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` sample ids 1, 2, 3… from ``packing``'s restarting positions (padding included).

    >>> segment_ids_from_position_ids(torch.tensor([[0, 1, 2, 0, 1, 0, 0]])).tolist()
    [[1, 1, 1, 2, 2, 3, 4]]
    """
    return sample_starts_from_position_ids(position_ids).long().cumsum(-1)


def segment_ids_from_4d_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` ids 1, 2, 3… from a ``[B, 1, T, T]`` block-diagonal causal mask (bool, True = visible;
    or additive float, 0 = visible): a sample starts at every token that cannot see the one before it.

    >>> visible = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]], dtype=torch.bool)
    >>> segment_ids_from_4d_mask(visible[None, None]).tolist()
    [[1, 1, 2, 2]]
    """
    visible = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    sees_previous = visible[:, 0].diagonal(offset=-1, dim1=-2, dim2=-1)
    starts = torch.ones_like(visible[:, 0, :, 0], dtype=torch.bool)
    starts[:, 1:] = ~sees_previous
    return starts.long().cumsum(-1)


def packed_segment_ids(attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None) -> torch.Tensor | None:
    """``[B, T]`` sample ids (0 on padding) when some row holds several packed samples, else ``None``.

    The three forms LLaMA-Factory sends, in the order they are trusted: a 4-D mask, a 2-D mask holding
    segment ids (``neat_packing``: some value > 1), restarting ``position_ids`` (``packing``).

    >>> packed_segment_ids(torch.tensor([[1, 1, 2, 2, 0]]), None).tolist()
    [[1, 1, 2, 2, 0]]
    >>> packed_segment_ids(torch.tensor([[1, 1, 1, 1, 0]]), torch.tensor([[0, 1, 0, 1, 0]])).tolist()
    [[1, 1, 2, 2, 0]]
    >>> visible = block_causal_mask(torch.tensor([[1, 2, 2]]))
    >>> packed_segment_ids(visible, None).tolist()
    [[1, 2, 2]]
    >>> print(packed_segment_ids(torch.tensor([[1, 1, 1]]), torch.tensor([[0, 1, 2]])))  # one sample per row
    None
    """
    if attention_mask is not None and attention_mask.dim() == 4:
        segments = segment_ids_from_4d_mask(attention_mask)
        return segments if bool((segments[:, -1] > 1).any()) else None
    if attention_mask is not None and attention_mask.dim() == 2 and bool((attention_mask > 1).any()):
        return attention_mask.long()
    if position_ids is None or position_ids.shape[-1] < 2:
        return None
    segments = segment_ids_from_position_ids(position_ids)
    if not bool((segments[:, -1] > 1).any()):
        return None
    if attention_mask is not None and attention_mask.dim() == 2:
        # The mask's last T columns: during prefill with a cache it may also cover earlier tokens.
        segments = segments.masked_fill(attention_mask[:, -segments.shape[-1] :] == 0, 0)
    return segments


def row_segment_ids(attention_mask: torch.Tensor | None, position_ids: torch.Tensor) -> torch.Tensor:
    """As :func:`packed_segment_ids`, but always a tensor: an unpacked row is sample 1 (0 on padding).

    >>> row_segment_ids(torch.tensor([[0, 1, 1]]), torch.tensor([[0, 1, 2]])).tolist()
    [[0, 1, 1]]
    >>> row_segment_ids(None, torch.tensor([[0, 1, 2, 0, 1]])).tolist()
    [[1, 1, 1, 2, 2]]
    """
    segments = packed_segment_ids(attention_mask, position_ids)
    if segments is not None:
        return segments
    if attention_mask is None:
        return torch.ones_like(position_ids, dtype=torch.long)
    return (attention_mask != 0).long()


def cu_seqlens_from_starts(starts: torch.Tensor) -> torch.Tensor:
    """int32 ``[N + 1]`` borders over the flattened ``B * T`` tokens; ``starts`` is ``[B, T]`` bool.
    Every row start is a border, whatever ``starts`` says there.

    >>> cu_seqlens_from_starts(torch.tensor([[True, False, True], [False, False, True]])).tolist()
    [0, 2, 3, 5, 6]
    """
    starts = starts.clone()
    starts[:, 0] = True
    flat = starts.flatten()
    begin = torch.nonzero(flat).flatten()
    end = flat.new_tensor([flat.numel()], dtype=begin.dtype)
    return torch.cat([begin, end]).to(torch.int32)


def cu_seqlens_from_segment_ids(segment_ids: torch.Tensor) -> torch.Tensor:
    """int32 ``[N + 1]`` borders over the flattened ``B * T`` tokens, FlashAttention/fla style.

    ``segment_ids`` is ``[B, T]`` (or ``[T]``) with 1, 2, 3… per sample and 0 for padding. A segment
    starts at each row start and wherever the id changes, so every stretch of padding is a segment of
    its own, isolated from the real tokens on both sides. A plain 0/1 attention mask works too.

    >>> cu_seqlens_from_segment_ids(torch.tensor([[1, 1, 2, 2, 2, 0], [0, 0, 1, 1, 1, 1]])).tolist()
    [0, 2, 5, 6, 8, 12]
    """
    segment_ids = _check_rows("segment_ids", segment_ids)
    if (segment_ids < 0).any():
        row, col = (int(i) for i in torch.nonzero(segment_ids < 0)[0])
        raise ValueError(
            f"segment_ids must be >= 0 (0 = padding), got {int(segment_ids[row, col])} at [{row}, {col}]."
        )
    return cu_seqlens_from_starts(segment_starts(segment_ids))


def block_causal_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """``[B, 1, T, T]`` bool (True = may attend): causal, and only within the token's own segment id.

    >>> block_causal_mask(torch.tensor([[1, 1, 2, 2]]))[0, 0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    """
    length = segment_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segment_ids.device).tril()
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return (same & causal)[:, None]


def flash_varlen_kwargs(segment_ids: torch.Tensor) -> dict[str, torch.Tensor | int]:
    """FlashAttention's varlen arguments for packed rows: each segment of ``segment_ids`` attends alone.

    transformers' FlashAttention path takes ``cu_seq_lens_q/k`` and ``max_length_q/k`` as keyword
    arguments and then needs no mask. It would infer borders from restarting ``position_ids`` only for
    a batch of one row, and attend across samples in every row of a larger batch, so the borders over
    all ``B * T`` tokens are given explicitly (padding stretches are segments of their own).

    >>> kwargs = flash_varlen_kwargs(torch.tensor([[1, 1, 2, 2, 2, 0], [0, 0, 1, 1, 1, 1]]))
    >>> kwargs["cu_seq_lens_q"].tolist(), kwargs["max_length_q"]
    ([0, 2, 5, 6, 8, 12], 4)
    >>> kwargs["cu_seq_lens_k"] is kwargs["cu_seq_lens_q"] and kwargs["max_length_k"] == kwargs["max_length_q"]
    True
    """
    cu_seqlens = cu_seqlens_from_segment_ids(segment_ids)
    max_length = int(cu_seqlens.diff().max())
    return {
        "cu_seq_lens_q": cu_seqlens,
        "cu_seq_lens_k": cu_seqlens,
        "max_length_q": max_length,
        "max_length_k": max_length,
    }


def positions_within_segments(segment_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` RoPE positions 0, 1, 2… restarting at each segment start: each packed sample's own.

    >>> positions_within_segments(torch.tensor([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])).tolist()
    [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]
    """
    index = torch.arange(segment_ids.shape[-1], device=segment_ids.device).expand_as(segment_ids)
    starts = segment_starts(segment_ids)
    return index - torch.where(starts, index, torch.zeros_like(index)).cummax(-1).values

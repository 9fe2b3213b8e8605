"""Causal-LM loss straight from hidden states, never holding full-vocabulary logits for the whole sequence.

At 1M tokens the logits alone are 1M × 151936 values. On GPU Liger's fused linear cross-entropy
(Triton) avoids them; Liger cannot run where Triton cannot (CPU), and LLaMA-Factory's
``enable_liger_kernel`` does not know the ``zebra`` model type, so this module provides both
implementations with one contract: Liger's kernel and a chunked PyTorch function. Which one runs is the
kernel registry's ``loss`` op (``kernels/registry.py``; this module binds these functions to its entries, at its
end): :func:`fused_causal_lm_loss` runs what it chooses, at each training forward.

The chunked function computes the gradients of each token chunk during the forward pass (as Liger
does) and scales them by the incoming gradient in backward, so memory is one chunk of logits plus
the gradients, whatever the sequence length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .kernels import Call, KernelLoadError, Key, Op, bind, run

# The label LLaMA-Factory's collators write for prompt and padding tokens (``llamafactory.extras.constants.
# IGNORE_INDEX``, PyTorch's cross-entropy default). Spelled out, not imported: the model code stays importable
# without LLaMA-Factory's import chain; tests/ops/test_loss.py checks the two agree.
IGNORE_INDEX = -100
# One chunk of fp32 logits stays at or below this many elements (64 MiB): 64 tokens for Qwen3's 151,936 vocab.
CHUNK_LOGIT_ELEMENTS = 1 << 24


def default_chunk_tokens(vocab_size: int) -> int:
    """A power of two such that one chunk's logits stay near ``CHUNK_LOGIT_ELEMENTS``."""
    return 1 << max(4, (CHUNK_LOGIT_ELEMENTS // max(vocab_size, 1)).bit_length() - 1)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, ignore_index, chunk_tokens):
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        total = torch.zeros((), dtype=dtype, device=hidden.device)
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_hidden = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if needs_grad else None
        weight_c = weight.to(dtype)
        for start in range(0, hidden.shape[0], chunk_tokens):
            h = hidden[start : start + chunk_tokens]
            t = targets[start : start + chunk_tokens]
            valid = t != ignore_index
            logits = h.to(dtype) @ weight_c.t()
            log_probs = logits.log_softmax(dim=-1)
            safe_t = t.masked_fill(~valid, 0)
            total = total - (log_probs.gather(1, safe_t[:, None]).squeeze(1) * valid).sum()
            if needs_grad:
                d_logits = log_probs.exp_()
                d_logits[torch.arange(t.shape[0], device=t.device), safe_t] -= 1.0
                d_logits *= valid[:, None]
                if grad_hidden is not None:
                    grad_hidden[start : start + chunk_tokens] = (d_logits @ weight_c).to(hidden.dtype)
                grad_weight += d_logits.t() @ h.to(dtype)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        d_hidden = grad_hidden * grad_output.to(grad_hidden.dtype) if ctx.needs_input_grad[0] else None
        d_weight = None
        if ctx.needs_input_grad[1]:
            d_weight = (grad_weight * grad_output).to(ctx.weight_dtype)
        return d_hidden, d_weight, None, None, None


def chunked_linear_cross_entropy_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """Σ over non-ignored tokens of ``-log softmax(hidden @ weightᵀ)[target]`` (at least fp32), chunk by chunk."""
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"hidden must be [N, H] and targets [N], got {tuple(hidden.shape)} and {tuple(targets.shape)}"
        )
    chunk_tokens = default_chunk_tokens(weight.shape[0]) if chunk_tokens is None else chunk_tokens
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, targets, ignore_index, chunk_tokens)


def liger_linear_cross_entropy_sum(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int | None = None
) -> torch.Tensor:
    """Liger's fused linear cross-entropy, summed (``chunk_tokens`` is the chunked function's; Liger picks its own).

    An installed Liger that does not import raises :class:`~.kernels.KernelLoadError`: the registry passes it
    over (with a warning) and the chunked function runs."""
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
    except ImportError as error:
        raise KernelLoadError(f"liger_kernel does not import ({error})") from error

    return LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum")(weight, hidden, targets)


def logits_cross_entropy_sum(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int | None = None
) -> torch.Tensor:
    """The same sum from the whole ``[N, vocab]`` logits at once (at least fp32): the registry's ``logits``
    entry, what a training forward costs without the fused loss (the model then computes its logits itself,
    as it must return them), and the reference the fused functions are tested against."""
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    logits = hidden.to(dtype) @ weight.to(dtype).t()
    return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")


def shifted_targets(labels: torch.Tensor, shift_labels: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token targets aligned with every position, exactly as transformers' ``ForCausalLMLoss`` builds them."""
    if shift_labels is not None:
        return shift_labels
    return F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]


def fused_causal_lm_loss(
    hidden_states: torch.Tensor,
    lm_head_weight: torch.Tensor,
    labels: torch.Tensor | None,
    force: Key | None = None,
    num_items_in_batch: torch.Tensor | int | None = None,
    shift_labels: torch.Tensor | None = None,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """Mean next-token loss (or sum / ``num_items_in_batch``, as the HF Trainer asks) without full logits.

    The registry's ``loss`` op chooses the function for the hidden states (Liger's on a
    GPU with Liger installed, the chunked one otherwise); ``force`` demands one key (``liger``, ``chunked``).
    """
    targets = shifted_targets(labels, shift_labels).reshape(-1).to(hidden_states.device)
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1])
    call = Call.of(hidden, fused=True)
    total = run(Op.LOSS, call, hidden, lm_head_weight, targets, chunk_tokens=chunk_tokens, force=force)
    if num_items_in_batch is None:
        num_items_in_batch = (targets != IGNORE_INDEX).sum()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


bind(
    Op.LOSS,
    {
        Key.LIGER: liger_linear_cross_entropy_sum,
        Key.CHUNKED: chunked_linear_cross_entropy_sum,
        Key.LOGITS: logits_cross_entropy_sum,
    },
)

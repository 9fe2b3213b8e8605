"""Logit distillation (KL between teacher and student next-token distributions) without full logits.

At 64K tokens and Qwen3's 151,936-entry vocabulary, the ``[tokens, vocab]`` logits of *two* models are
~80 GB in fp32. Both losses here start from the two models' final hidden states and lm_head weights and
build logits one chunk of tokens at a time:

- :func:`kd_loss_sums` — the chunked PyTorch path (any device). Like ``loss.py``'s fused cross-entropy,
  it computes the gradients of each chunk during the forward pass and scales them in backward, so memory
  is one chunk of logits of each model plus the student's gradients, whatever the sequence length. It
  also returns the student's cross-entropy on the same targets, which costs nothing extra (the student's
  log-probabilities are already there) and is weighted in when ``ce_weight > 0``.
- Liger's ``LigerFusedLinearJSD`` (Triton) with ``jsd_beta`` 0 (forward KL) or 1 (reverse KL) on GPUs.

Which one a training step runs is the kernel registry's ``distillation loss`` op (this module binds these
functions to its entries, at its end): :func:`kd_loss_sums` runs what it chooses (``force="liger"`` demands
Liger's).

Conventions (both backends): at temperature T, with p the teacher's and q the student's softmax of
logits / T, the per-token loss is ``T² · KL(p‖q)`` (forward) or ``T² · KL(q‖p)`` (``reverse``), the T²
keeping gradient magnitudes independent of T (Hinton et al.). Only tokens whose shifted label is not
``IGNORE_INDEX`` count — prompt tokens and padding are masked exactly as in SFT's cross-entropy — and the
functions return *sums* over those tokens, so the caller divides by the Trainer's token count
(token-weighted across gradient accumulation and ranks, like the CE loss).
"""

from __future__ import annotations

import torch

from ..kernels import Call, KernelLoadError, Key, Op, bind, run
from ..loss import IGNORE_INDEX, default_chunk_tokens


class _ChunkedLinearKD(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        student_hidden,
        student_weight,
        teacher_hidden,
        teacher_weight,
        targets,
        temperature,
        reverse,
        kl_weight,
        ce_weight,
        chunk_tokens,
    ):
        dtype = torch.promote_types(student_hidden.dtype, torch.float32)
        device = student_hidden.device
        kd_total = torch.zeros((), dtype=dtype, device=device)
        ce_total = torch.zeros((), dtype=dtype, device=device)
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_hidden = torch.zeros_like(student_hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(student_weight.shape, dtype=dtype, device=device) if needs_grad else None
        # Masked tokens contribute nothing: only the rows with a target are ever multiplied by a weight.
        rows = (targets != IGNORE_INDEX).nonzero().squeeze(1)
        weight_s = student_weight.to(dtype)
        weight_t = teacher_weight.to(device=device, dtype=dtype)
        for start in range(0, rows.numel(), chunk_tokens):
            index = rows[start : start + chunk_tokens]
            h_s = student_hidden.index_select(0, index).to(dtype)
            h_t = teacher_hidden.index_select(0, index.to(teacher_hidden.device)).to(device=device, dtype=dtype)
            logits = h_s @ weight_s.t()
            log_q = (logits / temperature).log_softmax(-1)
            with torch.no_grad():
                log_p = ((h_t @ weight_t.t()) / temperature).log_softmax(-1)
            if reverse:
                q = log_q.exp()
                kl = (q * (log_q - log_p)).sum(-1)
                d_scaled = q * (log_q - log_p - kl[:, None])
            else:
                p = log_p.exp()
                kl = (p * (log_p - log_q)).sum(-1)
                d_scaled = log_q.exp() - p
            kd_total += kl.sum() * temperature**2
            log_softmax = log_q if temperature == 1.0 else logits.log_softmax(-1)
            target = targets.index_select(0, index)[:, None]
            ce_total -= log_softmax.gather(1, target).sum()
            if needs_grad:
                # d(T² KL)/d logits = T · d KL/d(logits / T); d CE/d logits = softmax - one_hot.
                d_logits = d_scaled.mul_(kl_weight * temperature)
                if ce_weight:
                    d_ce = log_softmax.exp()
                    d_ce.scatter_add_(1, target, torch.full_like(target, -1, dtype=dtype))
                    d_logits += ce_weight * d_ce
                if grad_hidden is not None:
                    grad_hidden.index_copy_(0, index, (d_logits @ weight_s).to(student_hidden.dtype))
                grad_weight += d_logits.t() @ h_s
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = student_weight.dtype
        ctx.mark_non_differentiable(kd_total, ce_total)
        total = kl_weight * kd_total + ce_weight * ce_total
        return total, kd_total, ce_total

    @staticmethod
    def backward(ctx, grad_total, _grad_kd, _grad_ce):
        grad_hidden, grad_weight = ctx.saved_tensors
        d_hidden = grad_hidden * grad_total.to(grad_hidden.dtype) if ctx.needs_input_grad[0] else None
        d_weight = (grad_weight * grad_total).to(ctx.weight_dtype) if ctx.needs_input_grad[1] else None
        return d_hidden, d_weight, None, None, None, None, None, None, None, None


def kd_loss_sums(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    reverse: bool = False,
    kl_weight: float = 1.0,
    ce_weight: float = 0.0,
    force: Key | None = None,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(kl_weight·KD + ce_weight·CE, KD, CE)`` summed over target tokens; only the first is differentiable.

    ``student_hidden`` ``[N, H]`` and ``teacher_hidden`` ``[N, H']`` are the two models' final hidden states
    (after the final norm), ``targets`` ``[N]`` the shifted labels (``IGNORE_INDEX`` = not counted). KD is
    ``T²·KL`` (see the module doc), CE the student's cross-entropy at temperature 1. The registry chooses the
    function (``force`` demands a key); Liger's computes KD with its fused JSD kernel and CE with its fused
    cross-entropy only when ``ce_weight > 0`` (the returned CE is ``None`` otherwise).
    """
    if student_hidden.dim() != 2 or teacher_hidden.dim() != 2 or targets.shape != student_hidden.shape[:1]:
        raise ValueError(
            f"student_hidden [N, H], teacher_hidden [N, H'] and targets [N] expected, got "
            f"{tuple(student_hidden.shape)}, {tuple(teacher_hidden.shape)} and {tuple(targets.shape)}"
        )
    if teacher_hidden.shape[0] != student_hidden.shape[0] or teacher_weight.shape[0] != student_weight.shape[0]:
        raise ValueError(
            f"teacher and student disagree: {teacher_hidden.shape[0]} vs {student_hidden.shape[0]} tokens, "
            f"vocabulary {teacher_weight.shape[0]} vs {student_weight.shape[0]}"
        )
    if temperature <= 0:
        raise ValueError(f"kd_temperature must be positive, got {temperature}")
    arguments = (student_hidden, student_weight, teacher_hidden, teacher_weight, targets)
    weights = (temperature, reverse, kl_weight, ce_weight)
    call = Call.of(student_hidden)
    return run(Op.DISTILLATION_LOSS, call, *arguments, *weights, chunk_tokens, force=force)


def _chunked_kd_loss_sums(
    student_hidden,
    student_weight,
    teacher_hidden,
    teacher_weight,
    targets,
    temperature,
    reverse,
    kl_weight,
    ce_weight,
    chunk_tokens,
):
    vocab = student_weight.shape[0]
    # The fused-CE chunk (64 tokens for Qwen3's vocabulary): a few times its 64 MiB of logits live at once.
    chunk_tokens = default_chunk_tokens(vocab) if chunk_tokens is None else chunk_tokens
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    return _ChunkedLinearKD.apply(
        student_hidden,
        student_weight,
        teacher_hidden,
        teacher_weight,
        targets,
        float(temperature),
        bool(reverse),
        float(kl_weight),
        float(ce_weight),
        chunk_tokens,
    )


def _liger_kd_loss_sums(
    student_hidden,
    student_weight,
    teacher_hidden,
    teacher_weight,
    targets,
    temperature,
    reverse,
    kl_weight,
    ce_weight,
    chunk_tokens,
):
    """Liger returns the *mean* KL over target tokens, without the T² factor: rescale to this module's sum
    (``chunk_tokens`` is the chunked function's; Liger picks its own). An installed Liger that does not import
    raises :class:`~..kernels.KernelLoadError`: the registry passes it over and the chunked function runs."""
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
        from liger_kernel.transformers.fused_linear_jsd import LigerFusedLinearJSD
    except ImportError as error:
        raise KernelLoadError(f"liger_kernel does not import ({error})") from error

    count = (targets != IGNORE_INDEX).sum()
    jsd = LigerFusedLinearJSD(jsd_beta=1.0 if reverse else 0.0, ignore_index=IGNORE_INDEX, temperature=temperature)
    kd = jsd(student_hidden, student_weight, teacher_hidden, teacher_weight.to(student_weight.dtype), targets)
    kd = kd * count * temperature**2
    total = kl_weight * kd
    ce = None
    if ce_weight:
        ce = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum")(
            student_weight, student_hidden, targets
        )
        total = total + ce_weight * ce
        ce = ce.detach()
    return total, kd.detach(), ce


def full_logits_kd_loss_sums(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    reverse: bool = False,
    kl_weight: float = 1.0,
    ce_weight: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The obvious version of :func:`kd_loss_sums` with whole ``[N, vocab]`` logits: the reference that tests
    and ``benchmarks/bench_distill.py`` compare against (autograd does the gradients)."""
    dtype = torch.promote_types(student_hidden.dtype, torch.float32)
    valid = targets != IGNORE_INDEX
    logits = student_hidden.to(dtype) @ student_weight.to(dtype).t()
    log_q = torch.log_softmax(logits / temperature, dim=-1)
    with torch.no_grad():
        log_p = torch.log_softmax((teacher_hidden.to(dtype) @ teacher_weight.to(dtype).t()) / temperature, dim=-1)
    if reverse:
        kl = (log_q.exp() * (log_q - log_p)).sum(-1)
    else:
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    kd = (kl * valid).sum() * temperature**2
    ce = torch.nn.functional.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")
    return kl_weight * kd + ce_weight * ce, kd.detach(), ce.detach()


bind(Op.DISTILLATION_LOSS, {Key.LIGER: _liger_kd_loss_sums, Key.CHUNKED: _chunked_kd_loss_sums})

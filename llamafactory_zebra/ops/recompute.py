"""Recompute an elementwise op in backward instead of keeping its intermediates: :func:`recomputed`.

Written in PyTorch, a short formula such as the gated RMSNorm (``x * rsqrt(mean(x^2) + eps) * weight *
silu(gate)``) or the short convolution's taps and SiLU keeps several activation-sized intermediates from
forward to backward, one per operation that needs its input or output for the gradient: five to ten times
the size of its inputs, for every layer of the model at once. :func:`recomputed` keeps the inputs only and
runs the formula once more in backward, one layer at a time, as fla's fused kernels and activation
checkpointing do. The backward differentiates that second run with autograd, so the gradients are those of
autograd through the formula, bit for bit (CPU kernels are deterministic; the autocast state of the forward
is restored for the second run).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class _Recomputed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn: Callable[..., torch.Tensor], *args):
        tensor_positions = [index for index, arg in enumerate(args) if isinstance(arg, torch.Tensor)]
        ctx.fn, ctx.args, ctx.tensor_positions = fn, list(args), tensor_positions
        for index in tensor_positions:
            ctx.args[index] = None  # kept by save_for_backward, not by the context
        ctx.save_for_backward(*(args[index] for index in tensor_positions))
        device = next(args[index] for index in tensor_positions).device.type
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        return fn(*args)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        args = list(ctx.args)
        inputs = []
        for index, tensor in zip(ctx.tensor_positions, ctx.saved_tensors, strict=True):
            args[index] = tensor.detach().requires_grad_(ctx.needs_input_grad[index + 1])
            if ctx.needs_input_grad[index + 1]:
                inputs.append(args[index])
        device, enabled, dtype = ctx.autocast
        with torch.enable_grad(), torch.autocast(device, dtype=dtype, enabled=enabled):
            output = ctx.fn(*args)
        grads = iter(torch.autograd.grad(output, inputs, grad_output, allow_unused=True))
        return None, *(next(grads) if ctx.needs_input_grad[index + 1] else None for index in range(len(args)))


def recomputed(fn: Callable[..., torch.Tensor], *args) -> torch.Tensor:
    """``fn(*args)`` (one tensor out), keeping only the tensor arguments for backward, where ``fn`` runs again.

    ``fn`` must be deterministic and must not modify its arguments; non-tensor arguments are passed as they
    are. Without a gradient to compute this is a plain call.
    """
    tensors = [arg for arg in args if isinstance(arg, torch.Tensor)]
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return fn(*args)
    return _Recomputed.apply(fn, *args)

"""Differentiable collectives over a sequence-parallel group that also work on gloo subgroups.

Why not ``torch.distributed.nn``: its ``all_gather`` backward fails on gloo subgroups as soon as there
is more than one group ("Global rank 0 is not part of group", measured with SP 2 x DP 2), which is the
CPU test layout. The all-gather here reduces its gradient with ``reduce_scatter_tensor`` where the
backend has it and with ``all_reduce`` + slice on gloo. The all-to-all's backward is the reverse
all-to-all, written once for both directions.

Rule for callers (each rank runs its own autograd graph): every rank must keep the output of every
collective in the graph that reaches its loss, or the backward collectives stop matching across ranks
and the job hangs. :func:`anchor` ties a collective's output into a tensor whose value it does not change.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup


def _world(group: ProcessGroup | None) -> int:
    return dist.get_world_size(group)


def _has_reduce_scatter(group: ProcessGroup | None) -> bool:
    return dist.get_backend(group) != "gloo"


# torch 2.14 renamed the single-tensor collectives; older releases (GPU images) only have the old names.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        out = tensor.new_empty(_world(group) * tensor.numel())
        _all_gather_flat(out, tensor.reshape(-1).contiguous(), group=group)
        return out.view(_world(group), *tensor.shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        if _has_reduce_scatter(ctx.group):
            out = grad.new_empty(grad.shape[1:])
            _reduce_scatter_flat(out.view(-1), grad.view(-1), group=ctx.group)
            return out, None
        dist.all_reduce(grad, group=ctx.group)
        return grad[dist.get_rank(ctx.group)].clone(), None


def all_gather(tensor: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
    """``[world, *tensor.shape]``: every rank's tensor, rank order; the gradient is summed back to its owner."""
    return _AllGather.apply(tensor, group)


def _exchange(tensor: torch.Tensor, scatter_dim: int, gather_dim: int, group: ProcessGroup | None) -> torch.Tensor:
    world = _world(group)
    if tensor.shape[scatter_dim] % world:
        raise ValueError(
            f"all-to-all: dimension {scatter_dim} of size {tensor.shape[scatter_dim]} must divide by the "
            f"sequence-parallel size {world}"
        )
    send = torch.stack(tensor.chunk(world, dim=scatter_dim)).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, scatter_dim: int, gather_dim: int, group: ProcessGroup | None):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _exchange(tensor, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _exchange(grad, gather_dim, scatter_dim, ctx.group), None, None, None


def all_to_all(tensor: torch.Tensor, scatter_dim: int, gather_dim: int, group: ProcessGroup | None) -> torch.Tensor:
    """Split ``scatter_dim`` into ``world`` blocks, send block j to rank j, concatenate what arrives along
    ``gather_dim`` in rank order (Ulysses: sequence-sharded ↔ head-sharded)."""
    return _AllToAll.apply(tensor, scatter_dim, gather_dim, group)


@torch.no_grad()
def gather_sequence(tensor: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
    """Concatenate every rank's ``[B, T_local, ...]`` shard along dim 1 (no gradient: ids, masks)."""
    return torch.cat(all_gather(tensor, group).unbind(0), dim=1)


def anchor(tensor: torch.Tensor, *collective_outputs: torch.Tensor) -> torch.Tensor:
    """``tensor`` unchanged in value, with a zero-weighted edge to each collective output.

    A rank that does not need a collective's result (rank 0 has no earlier rank's state to read) must
    still run that collective's backward, or the other ranks wait forever for it.
    """
    for output in collective_outputs:
        tensor = tensor + output.sum().to(tensor.dtype) * 0
    return tensor

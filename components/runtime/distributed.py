"""The one distributed-gather helper, and the reduction that makes DDP gradients exact.

Semantics (open_clip's "local loss, gathered candidates", made exact):

* :func:`gather` concatenates a tensor's rows from every rank in rank order (ranks may hold
  different numbers of rows). With ``grad=True`` its backward sums the incoming gradient
  over all ranks and returns this rank's slice, so candidates used by *other* ranks' anchors
  send their gradient back to the rank that produced them. (The common shortcut "all_gather,
  then put the local tensor back" keeps only the local part of that gradient.) Ranks first
  exchange their row counts (an all-gather and a host read, i.e. a synchronisation) unless
  the caller passes them as ``sizes``: an objective exchanges them once per step (or not at
  all when every rank's batch is known to be equally large, as with training's
  ``drop_last``) and hands them to each of its gathers.
* Each rank scores its local anchors against the gathered candidates. :func:`global_mean`
  turns per-anchor losses into this rank's share ``sum_local * world_size / count_global``.
  DDP averages parameter gradients over ranks, so the applied gradient is that of
  ``sum_all / count_global``: the single-process loss on the concatenated batch, whatever
  the world size and however the valid anchors are spread over ranks.

Without an initialised process group every function is the single-process identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor


def _all_gather_single(output: Tensor, input: Tensor) -> None:
    """Equal-size all-gather into one tensor. torch >= 2.12 names it ``all_gather_single``;
    older torch (2.11 is what the lent GPU image and many preinstalled nodes have: its absence
    stopped every training run there) has it as ``all_gather_into_tensor``. Looked up at each
    call, so that a patched ``dist`` (tests/support/strict_device.py) is what runs."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(output, input)


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def gathered_sizes(n_local: int, device: torch.device | None = None) -> list[int]:
    """Row count of every rank, in rank order (``[n_local]`` when not distributed).

    One all-gather and one device-to-host read (a host synchronisation): exchange the sizes
    once per step and pass them to :func:`gather` / :func:`row_offset` as ``sizes``.
    """
    if not is_distributed():
        return [n_local]
    n = torch.full((1,), n_local, dtype=torch.int64, device=device)  # a fill, not a copy
    out = n.new_empty(world_size())
    _all_gather_single(out, n)
    return [int(s) for s in out.tolist()]  # one read for all ranks


def _checked_sizes(sizes: Sequence[int], n_local: int) -> list[int]:
    """``sizes`` as a list, after the checks this rank can make without communicating."""
    out = [int(s) for s in sizes]
    if len(out) != world_size() or any(s < 0 for s in out) or out[rank()] != n_local:
        raise ValueError(f"sizes={out} must give each of the {world_size()} ranks' row counts "
                         f"in rank order; this rank (rank {rank()}) has {n_local} rows")
    return out


def _all_gather_varlen(x: Tensor, sizes: Sequence[int] | None = None
                       ) -> tuple[Tensor, list[int]]:
    """All-gather rows of ``x`` ([n_r, ...], n_r may differ per rank) → ([sum n_r, ...], sizes).

    ``sizes`` (every rank's n_r, when the caller knows them) skips the size exchange; equal
    sizes also skip the padding and the per-rank slices.
    """
    ws = world_size()
    sizes = (gathered_sizes(x.shape[0], x.device) if sizes is None
             else _checked_sizes(sizes, x.shape[0]))
    longest = max(sizes)
    if x.shape[0] < longest:  # pad so every rank sends the same shape
        pad = x.new_zeros((longest - x.shape[0], *x.shape[1:]))
        x = torch.cat([x, pad])
    out = x.new_empty((ws * longest, *x.shape[1:]))  # [W·longest, ...], rank r's rows at r·longest
    _all_gather_single(out, x.contiguous())
    if all(s == longest for s in sizes):
        return out, sizes
    parts = out.split(longest)
    return torch.cat([p[:s] for p, s in zip(parts, sizes, strict=True)]), sizes


class _GatherWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, sizes: Sequence[int] | None) -> Tensor:  # type: ignore[override]
        out, ctx.sizes = _all_gather_varlen(x, sizes)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        # Every rank's loss may depend on every rank's rows: sum the gradients, keep our slice.
        grad = grad.contiguous()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        start = sum(ctx.sizes[: rank()])
        return grad[start : start + ctx.sizes[rank()]], None


def gather(x: Tensor, grad: bool = True, sizes: Sequence[int] | None = None) -> Tensor:
    """Rows of ``x`` from all ranks, concatenated in rank order: [n_r, ...] → [Σ n_r, ...].

    ``grad=True`` keeps autograd through the gather (see the module docstring); ``grad=False``
    returns a detached tensor. ``sizes``: every rank's row count n_r in rank order, when the
    caller knows them (e.g. from one :func:`gathered_sizes` per step, or equal batches):
    without them each call first exchanges the sizes, a host synchronisation. Identity when
    not distributed.

    Raises:
        ValueError: ``sizes`` of the wrong length, or not naming this rank's row count.
    """
    if not is_distributed():
        return x if grad else x.detach()
    if grad and x.requires_grad:
        return _GatherWithGrad.apply(x, sizes)
    with torch.no_grad():
        return _all_gather_varlen(x.detach(), sizes)[0]


def row_offset(n_local: int, device: torch.device | None = None,
               sizes: Sequence[int] | None = None) -> int:
    """Index of this rank's first row in a :func:`gather` of tensors with ``n_local`` rows
    (``sizes``: every rank's row count, if known; else they are exchanged)."""
    if not is_distributed():
        return 0
    known = (gathered_sizes(n_local, device) if sizes is None
             else _checked_sizes(sizes, n_local))
    return sum(known[: rank()])


def all_reduce_sum(x: Tensor) -> Tensor:
    """Sum over ranks of a detached tensor (a copy; the input is untouched)."""
    x = x.detach().clone()
    if is_distributed():
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def global_mean(per_anchor: Tensor, valid: Tensor) -> tuple[Tensor, float, int, int]:
    """Mean of ``per_anchor`` [A] over ``valid`` [A] anchors of *all* ranks, DDP-ready.

    Returns ``(share, value, count, total)``: ``share`` is this rank's differentiable part,
    ``Σ_local valid loss · world_size / count_global`` (DDP's gradient averaging then gives the
    exact global-mean gradient); ``value`` is the global mean as a float (the number to log);
    ``count`` the number of valid anchors over all ranks, ``total`` of all anchors. With no
    valid anchor anywhere the share is ``0 · Σ per_anchor``, which still has a graph.
    """
    # where(): invalid rows may hold inf/NaN placeholders; never multiply them by 0.
    local_sum = torch.where(valid, per_anchor, torch.zeros_like(per_anchor)).sum()
    stats = all_reduce_sum(torch.stack([
        local_sum.detach(), valid.sum().to(local_sum.dtype),
        torch.full((), valid.numel(), dtype=local_sum.dtype, device=valid.device)]))
    loss_sum, count_f, total_f = stats.tolist()  # one device-to-host copy, not three
    count, total = round(count_f), round(total_f)
    if count == 0:
        return local_sum * 0.0, 0.0, 0, total
    share = local_sum * (world_size() / count)
    return share, loss_sum / count, count, total


def mean_over_ranks(values: Tensor) -> float:
    """Mean of ``values`` [n_r] over the rows of every rank (no gradient) — for metrics."""
    v = values.detach()
    stats = all_reduce_sum(
        torch.stack([v.sum(), torch.tensor(v.numel(), dtype=v.dtype, device=v.device)])
    )
    return float(stats[0] / stats[1]) if float(stats[1]) else 0.0


def node_layout(node_ids: Sequence[str], rank: int) -> dict[str, int]:
    """``rank``'s place among nodes, from every rank's Ray node id (in rank order): nodes are
    numbered in order of their lowest rank. Ray Train numbers nodes by IP address, so two
    nodes that share one (containers, a test cluster on one host) both get ``node_rank`` 0
    there; node ids are unique per raylet.

    Returns: ``node_rank``, ``local_rank`` (among this node's ranks, in rank order),
    ``local_world_size`` and ``num_nodes``.
    """
    order = list(dict.fromkeys(node_ids))
    mine = node_ids[rank]
    peers = [r for r, n in enumerate(node_ids) if n == mine]
    return {"node_rank": order.index(mine), "local_rank": peers.index(rank),
            "local_world_size": len(peers), "num_nodes": len(order)}


def all_node_ids(node_id: str) -> list[str]:
    """Every rank's node id, in rank order (``[node_id]`` when not distributed)."""
    if not is_distributed():
        return [node_id]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, node_id)
    return [str(n) for n in out]


_M = TypeVar("_M", bound=torch.nn.Module)


class GlobalBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """BatchNorm over the batch of every rank, without a host synchronisation.

    ``torch.nn.SyncBatchNorm`` drops empty ranks' statistics with boolean-mask indexing: up
    to three host syncs per layer and step (docs/gpu.md). Here every rank sums ``x − k``
    and ``(x − k)²`` per channel and counts its elements, one all-reduce (differentiable:
    its backward is the all-reduce of the gradients) turns them into the global batch's
    ``mean = k + S₁/N`` and biased ``var = S₂/N − (S₁/N)²``, and the normalisation is the
    single-process one of the concatenated batch; running statistics take the unbiased
    variance, as BatchNorm's. The shift ``k`` is the running mean (the same on every rank:
    DDP broadcasts buffers), which keeps the sums' cancellation small. An empty rank adds
    zeros. Not distributed, or in eval mode: plain BatchNorm. Same parameters and buffers as
    BatchNorm, so state dicts load both ways (:func:`convert_global_batchnorm`).
    """

    def forward(self, x: Tensor) -> Tensor:
        if not (self.training and is_distributed()):
            return super().forward(x)
        from torch.distributed.nn.functional import all_reduce

        c = x.shape[1]
        dims = [0, *range(2, x.dim())]
        shape = [1, c] + [1] * (x.dim() - 2)
        k = (self.running_mean if self.running_mean is not None
             else x.new_zeros(c)).detach().to(x.dtype)
        d = x - k.view(shape)
        n_local = x.new_full((1,), float(x.numel() // max(c, 1)))  # a fill: no host read
        sums = all_reduce(torch.cat([d.sum(dims), (d * d).sum(dims), n_local]))  # [2C + 1]
        n = sums[2 * c:].clamp_min(1.0)
        m1 = sums[:c] / n  # E[x − k]
        var = (sums[c:2 * c] / n - m1 * m1).clamp_min(0.0)  # biased
        mean = k + m1
        y = (x - mean.view(shape)) * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats and self.running_mean is not None:
            assert self.running_var is not None and self.num_batches_tracked is not None
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                     else self.momentum)
                unbiased = var * (n / (n - 1.0).clamp_min(1.0))
                self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), m)
                self.running_var.lerp_(unbiased.detach().to(self.running_var.dtype), m)
        return y

    def _check_input_dim(self, x: Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input (got {x.dim()}-D)")


def convert_global_batchnorm(module: _M) -> _M:
    """Every BatchNorm layer of ``module`` (1-, 2- or 3-d) as a :class:`GlobalBatchNorm` with
    the same parameters and buffers (as ``SyncBatchNorm.convert_sync_batchnorm`` does); a
    container is changed in place and returned."""
    out: Any = module
    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and \
            not isinstance(module, GlobalBatchNorm):
        out = GlobalBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                              module.track_running_stats)
        if module.affine:
            with torch.no_grad():
                out.weight = module.weight
                out.bias = module.bias
        out.running_mean = module.running_mean
        out.running_var = module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.training = module.training
    for name, child in module.named_children():
        out.add_module(name, convert_global_batchnorm(child))
    return out  # type: ignore[no-any-return]

"""The global mean over every rank's anchors: an objective's loss share and its logged
statistics from one all-reduce and **one** device-to-host read (:func:`fused_global_means`,
:func:`reduce`), a read that also carries the batch's deferred input checks and the
objective's own (:mod:`components.objectives.batch`), raised alike on every rank.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from components.errors import NonFiniteError
from components.objectives.batch import ContrastiveBatch, DeferredCheck, Metrics
from components.runtime import distributed

GlobalMean = tuple[Tensor, float, int, int]  # (share, value, count, total): global_mean's


def fused_global_means(terms: Sequence[tuple[Tensor, Tensor]],
                       batch: ContrastiveBatch | None = None,
                       checks: Sequence[DeferredCheck | None] = ()) -> list[GlobalMean]:
    """:func:`components.runtime.distributed.global_mean` of each ``(per_anchor [A_k], valid
    [A_k])``
    term, with one all-reduce and **one** device-to-host read for all of them.

    That read also carries ``batch``'s pending input checks (:meth:`ContrastiveBatch.
    take_checks`) and the objective's ``checks`` (None entries skipped), this rank's own,
    not reduced; they are raised after it, the batch's first, then ``checks`` in order. The
    values are global_mean's: the statistics are summed in the terms' common dtype (read
    alongside the checks as Python floats: exact widenings).

    Distributed, the all-reduce also carries the sum of the batch's field sums (its finite
    check): summed over ranks it is NaN / inf when any rank's batch holds a NaN / inf, and
    then :class:`NonFiniteError` is raised on **every** rank, after the same collectives:
    fp16's step skipping (``components.training.step.SkippedStep``) is decided for all ranks at
    once, so no rank goes on alone into the next collective (DDP's all-reduce, a memory
    bank's all-gather) while another skips — a hang on NCCL. It rides in the reduce the step
    makes anyway: one number more, no collective or device read of its own.

    Raises:
        ValueError / NonFiniteError: ``batch``'s checks or one of ``checks`` failed (every
            rank has taken part in the all-reduce by then); NonFiniteError also when another
            rank's batch is not finite (the message names the ranks).
    """
    device = terms[0][0].device
    wide = torch.float32 if device.type == "mps" else torch.float64  # no f64 there
    # where(): invalid rows may hold inf/NaN placeholders; never multiply them by 0.
    local_sums = [torch.where(valid, per_anchor, 0.0).sum() for per_anchor, valid in terms]
    pending = batch.take_checks() if batch is not None else None
    own = [c for c in checks if c is not None]
    parts = ([] if pending is None else [pending.values]) + [c.values.reshape(-1) for c in own]
    dist = distributed.is_distributed()
    if dist:  # sum, count, total per term, summed over ranks
        dtype = functools.reduce(torch.promote_types, [p.dtype for p, _ in terms])
        checked = [p.to(device=device, dtype=wide) for p in parts]
        stats: list[Tensor] = []
        for local_sum, (_, valid) in zip(local_sums, terms, strict=True):
            stats += [local_sum.detach().to(dtype), valid.sum().to(dtype),
                      torch.full((), valid.numel(), dtype=dtype, device=valid.device)]
        # + 1: the sum of this rank's field sums, summed over ranks: NaN / inf when any
        # rank's batch is not finite (one number on every rank, whatever its batch holds:
        # the all-reduce's shapes must agree)
        stats.append(pending.values[: len(pending.names)].sum().to(dtype)
                     if pending is not None and pending.names
                     else torch.zeros((), dtype=dtype, device=device))
        reduced = distributed.all_reduce_sum(torch.stack(stats))  # [3·T + 1]
        read = torch.cat([reduced.to(wide), *checked]) if checked else reduced
    else:
        # Nothing to sum over ranks: the statistics are read as they are, in one stack (the
        # count promoted to the sums' dtype: exact below 2**24) that cat promotes with the
        # checks (exact widenings; every value is read as a Python float); the totals are
        # the terms' sizes, known here — a few kernels fewer.
        stats = [x for local_sum, (_, valid) in zip(local_sums, terms, strict=True)
                 for x in (local_sum.detach(), valid.sum())]
        read = torch.stack(stats)
        if read.dtype not in (torch.float32, torch.float64):  # counts in a half type: inexact
            read = read.to(wide)
        read = torch.cat([read, *parts]) if parts else read
    values = read.tolist()  # the one device-to-host copy
    if not dist:  # put the totals in: (sum, count, total) per term
        sums_counts, rest = values[: len(stats)], values[len(stats):]
        values = [x for k, (_, valid) in enumerate(terms)
                  for x in (*sums_counts[2 * k : 2 * k + 2], float(valid.numel()))] + rest
    at = 3 * len(terms)
    everywhere_finite = True
    if dist:
        everywhere_finite = math.isfinite(values[at])
        at += 1
    if pending is not None and batch is not None:
        batch.raise_failed(pending, values[at : at + pending.values.numel()])
        at += pending.values.numel()
    if not everywhere_finite:  # another rank's batch: every rank stops this step alike
        raise NonFiniteError(
            f"a batch on another rank than {distributed.rank()} holds non-finite values (NaN "
            "or inf): every rank stops this step")
    for check in own:
        check.raise_failed(values[at : at + check.values.numel()])
        at += check.values.numel()
    out: list[GlobalMean] = []
    for k, local_sum in enumerate(local_sums):
        loss_sum, count_f, total_f = values[3 * k : 3 * k + 3]
        count, total = round(count_f), round(total_f)
        if count == 0:  # no valid anchor anywhere: a zero share that still has a graph
            out.append((local_sum * 0.0, 0.0, 0, total))
        else:
            out.append((local_sum * (distributed.world_size() / count), loss_sum / count,
                        count, total))
    return out


def reduce(per_anchor: Tensor, valid: Tensor, batch: ContrastiveBatch | None = None,
           means: Mapping[str, Tensor] | None = None,
           checks: Sequence[DeferredCheck | None] = (), **extra: float) -> tuple[Tensor, Metrics]:
    """Global mean over valid anchors plus the standard metrics, in one device read
    (:func:`fused_global_means`, which also applies ``batch``'s pending checks and
    ``checks``).

    ``means``: per-anchor values ([A] each, no gradient) logged as their mean over every
    rank's anchors; ``extra``: plain metrics added as given.
    """
    means = dict(means or {})
    terms = [(per_anchor, valid)] + [(v, torch.ones_like(v, dtype=torch.bool))
                                     for v in means.values()]
    (share, value, count, total), *averaged = fused_global_means(terms, batch, checks)
    metrics = {
        "loss": value,
        "anchors": float(total),
        "anchors_without_positive": float(total - count),
    }
    metrics.update({k: m[1] for k, m in zip(means, averaged, strict=True)})
    metrics.update(extra)
    return share, metrics

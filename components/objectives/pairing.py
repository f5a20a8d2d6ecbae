"""Anchors against candidates: rows as unit float32 (:func:`unit`, :func:`at_least_fp32`),
this rank's batch paired with every rank's rows and the memory bank's (:func:`pair_up` →
:class:`Pairs`), and the two forms a hard target graph takes over them (:class:`PositivePairs`,
:class:`PositiveMask`).

Layout: a batch ``z`` of shape [B, V, D] is flattened sample-major (row ``b·V + v``);
gathered candidates are rank 0's rows, then rank 1's, …, then the bank's.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from components.objectives.batch import ContrastiveBatch
from components.objectives.memory import MemoryBank
from components.runtime import distributed


def at_least_fp32(x: Tensor) -> Tensor:
    """fp16/bf16 upcast to float32 (losses never run in half precision); float64 kept."""
    if x.dtype in (torch.float32, torch.float64):  # the common case, without a dispatch
        return x
    return x.to(torch.promote_types(x.dtype, torch.float32))


def unit(x: Tensor) -> Tensor:
    """Rows L2-normalised in at least float32.

    ``F.normalize(x, dim=-1)``'s operations (vector norm, clamp at 1e-12, divide) without its
    Python layers (``torch.norm``'s argument handling): the same kernels, the same values and
    gradients, a few microseconds less per call."""
    x = at_least_fp32(x)
    return x / torch.linalg.vector_norm(x, 2, -1, keepdim=True).clamp_min(1e-12)


@dataclasses.dataclass(kw_only=True)
class Pairs:
    """Anchors (this rank) against candidates (all ranks, then the bank), with their metadata.

    ``anchors`` [A, D] and ``candidates`` [M, D] are unit float32 rows; ``self_index`` [A] is
    each anchor's own column in the candidates; ``*_ids`` / ``*_labels`` are [A] / [M] int64
    (-1 where unknown); ``*_captions`` [A, E] / [M, E] or None.
    """

    anchors: Tensor
    candidates: Tensor
    self_index: Tensor
    anchor_ids: Tensor
    candidate_ids: Tensor
    anchor_labels: Tensor | None = None
    candidate_labels: Tensor | None = None
    anchor_captions: Tensor | None = None
    candidate_captions: Tensor | None = None
    views: int = 1  # V: batch candidates are [N·V] rows, sample-major
    # Hard graphs as [A, M] masks (small matrices) rather than positive pairs: decided once
    # per step for all of A × M (:data:`DENSE_GRAPH_ENTRIES`), so row chunks agree.
    dense_graphs: bool = False

    def rows(self, start: int, stop: int, anchors: Tensor | None = None,
             candidates: Tensor | None = None) -> Pairs:
        """The anchors ``start:stop`` against every candidate (``anchors`` / ``candidates``
        replace the tensors, e.g. by checkpoint's own inputs)."""

        def part(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[start:stop]

        return dataclasses.replace(
            self,
            anchors=self.anchors[start:stop] if anchors is None else anchors,
            candidates=self.candidates if candidates is None else candidates,
            self_index=self.self_index[start:stop], anchor_ids=self.anchor_ids[start:stop],
            anchor_labels=part(self.anchor_labels), anchor_captions=part(self.anchor_captions),
        )

    def self_mask(self) -> Tensor:
        """[A, M] bool, True at each anchor's own column."""
        mask = torch.zeros(
            self.anchors.shape[0],
            self.candidates.shape[0],
            dtype=torch.bool,
            device=self.anchors.device,
        )
        return mask.scatter_(1, self.self_index[:, None], True)


class PositivePairs(NamedTuple):
    """A hard graph as its True entries: ``rows`` [P] and ``cols`` [P] int64, row-major (the
    order ``mask.nonzero()`` lists them in), for reducers that only read the positives. Built
    without an A×M mask (:func:`components.objectives.targets.label_pairs`)."""

    rows: Tensor
    cols: Tensor


class PositiveMask(NamedTuple):
    """A hard graph as a 0/1 float mask ``mask`` [A, M] (the logits' dtype; 0 on each own
    column) and its row sums ``counts`` [A] (|P(i)|), for reducers that run on whole matrices:
    small batches (:data:`DENSE_GRAPH_ENTRIES`). Built by one compare
    (:func:`components.objectives.targets.label_positives`)."""

    mask: Tensor
    counts: Tensor

    def pairs(self) -> PositivePairs:
        """The same graph as :class:`PositivePairs` (one ``nonzero`` scan)."""
        return PositivePairs(*self.mask.nonzero(as_tuple=True))


@functools.lru_cache(maxsize=64)
def _row_numbers(n: int, views: int, device: torch.device) -> Tensor:
    """[n·views] int64 ``r // views`` (0, …, 0, 1, …: each of n rows once per view), cached
    per (n, views, device): every step of a run asks for the same few, and making them is
    a few kernel launches each time. Shared: read it, never write to it.

    Made outside inference mode (an inference tensor could not be saved for backward by
    a later step's autograd)."""
    with torch.inference_mode(False), torch.no_grad():
        return torch.arange(n, device=device).repeat_interleave(views)


def pair_up(batch: ContrastiveBatch, bank: MemoryBank | None = None,
            sizes: Sequence[int] | None = None) -> Pairs:
    """Gather candidates from every rank (with autograd) and append the bank's rows.

    ``sizes``: every rank's B (default :meth:`ContrastiveBatch.sizes_per_rank`), shared by
    all the gathers here, so they exchange no sizes.
    """
    b, v, _ = batch.z.shape
    device = batch.z.device
    sizes = batch.sizes_per_rank() if sizes is None else list(sizes)
    offset = distributed.row_offset(b, device, sizes=sizes)
    anchors = unit(batch.z).flatten(0, 1)  # [B·V, D], row b·V + v
    candidates = distributed.gather(anchors, sizes=[n * v for n in sizes])  # [N·V, D]
    self_index = _row_numbers(b * v, 1, device)  # [B·V] this rank's rows: 0, 1, …
    if offset:
        self_index = self_index + offset * v

    def per_view(t: Tensor) -> Tensor:  # [B, ...] -> [B·V, ...]
        return t.repeat_interleave(v, dim=0)

    def as_index(t: Tensor) -> Tensor:  # int64 on z's device (no dispatch when it is)
        return t if t.dtype == torch.int64 and t.device == device else t.to(device, torch.int64)

    ids = batch.sample_ids
    dist = distributed.is_distributed()
    if not dist:  # no collective: expand ids and labels directly (no [B, 2] stack)
        if ids is None:  # batch positions (cached): unique, meaningless across steps
            anchor_ids = _row_numbers(b, v, device)
        else:
            anchor_ids = per_view(as_index(ids))
        anchor_labels = None if batch.labels is None else per_view(as_index(batch.labels))
        candidate_ids, candidate_labels = anchor_ids, anchor_labels  # the gather = this batch
    else:
        if ids is None:  # batch positions: unique across ranks, meaningless across steps
            ids = offset + torch.arange(b, device=device)
        labels = batch.labels if batch.labels is not None else torch.full_like(ids, -1)
        # Per-sample metadata travels once (not once per view), in one collective.
        meta = torch.stack([ids.to(device).long(), labels.to(device).long()], dim=1)  # [B, 2]
        anchor_ids, anchor_labels = per_view(meta).T.contiguous()  # [B·V] each
        all_meta = distributed.gather(meta, grad=False, sizes=sizes)  # [N, 2]
        candidate_ids, candidate_labels = per_view(all_meta).T.contiguous()  # [N·V] each
    pairs = Pairs(
        anchors=anchors,
        candidates=candidates,
        self_index=self_index,
        anchor_ids=anchor_ids,
        candidate_ids=candidate_ids,
        views=v,
    )
    if batch.labels is not None:
        pairs.anchor_labels = anchor_labels
        pairs.candidate_labels = candidate_labels
    if batch.captions is not None:
        captions = unit(batch.captions)  # [B, E]
        pairs.anchor_captions = per_view(captions)
        pairs.candidate_captions = per_view(distributed.gather(captions, grad=False,
                                                               sizes=sizes))

    if bank is not None and len(bank):
        rows = bank.valid()
        pairs.candidates = torch.cat([pairs.candidates, rows["features"].to(anchors.dtype)])
        pairs.candidate_ids = torch.cat([pairs.candidate_ids, rows["ids"]])
        if pairs.candidate_labels is not None:
            pairs.candidate_labels = torch.cat([pairs.candidate_labels, rows["labels"]])
        if pairs.candidate_captions is not None and bank.captions.shape[1]:
            pairs.candidate_captions = torch.cat(
                [pairs.candidate_captions, unit(rows["captions"]).to(anchors.dtype)]
            )
        else:  # a bank without captions: no caption graph over these candidates
            pairs.candidate_captions = None
    return pairs

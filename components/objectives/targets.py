"""Target graphs over candidates: which candidates an anchor should be close to, how much.

Each function returns an [A, M] matrix over (anchors, candidates) of a :class:`Pairs`, zero
(or False) on each anchor's own column; a hard graph also comes as its list of True entries
(``*_pairs``, :class:`PositivePairs`), which reducers that read only the positives take
instead of the mask. A new graph source (a WordNet distance, a random
graph, …) is one more function here returning such a matrix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from components.objectives.batch import DeferredCheck
from components.objectives.pairing import Pairs, PositiveMask, PositivePairs, at_least_fp32


def _equal_key_pairs(anchor_keys: Tensor, candidate_keys: Tensor,
                     self_index: Tensor) -> PositivePairs:
    """Pairs (i, j) with ``anchor_keys[i] == candidate_keys[j] >= 0`` and j ≠ ``self_index[i]``,
    row-major (as ``mask.nonzero()`` lists the mask's True entries), without an A×M mask.

    The candidates' keys are sorted once (stably, so equal keys keep ascending column order);
    anchor i's matches are then the run ``order[lo_i:hi_i]`` found by binary search, less its
    own column where that is in the run (at sorted position ``pos_i``): its k-th pair is
    ``order[lo_i + k + (k >= pos_i − lo_i)]``, so no pair is made and then dropped. Cost
    O((A + M) log M + #pairs) — a handful of [#pairs] passes — instead of the mask's O(A·M)
    compare and ``nonzero`` scan. Keys are [A] / [M] int64; a negative key (unknown id or
    label) never matches.
    """
    m = candidate_keys.shape[0]
    order = torch.argsort(candidate_keys, stable=True)  # [M]
    # (index_select, not [·]: the same gather, several times faster for long index lists)
    ordered = candidate_keys.index_select(0, order)
    lo = torch.searchsorted(ordered, anchor_keys, side="left")  # [A]
    runs = torch.searchsorted(ordered, anchor_keys, side="right") - lo
    known = anchor_keys >= 0
    # pos_i: the own column's place in the sorted keys (inverse permutation); it lies in
    # anchor i's run iff its key is anchor i's (always so for pair_up's candidates).
    place = torch.empty_like(order).scatter_(0, order, torch.arange(m, device=order.device))
    own = known & (candidate_keys.index_select(0, self_index) == anchor_keys)  # [A]
    runs = torch.where(known, runs - own.long(), 0)  # [A] pairs per anchor
    first = torch.cumsum(runs, 0) - runs  # [A] anchor i's first entry in rows
    rows = torch.repeat_interleave(runs)  # [P]: i repeated runs_i times
    # Entry t = first_i + k of rows is order[lo_i + k (+1 from the own column on)]:
    # t + (lo_i − first_i), plus 1 where t >= pos_i − lo_i + first_i (never without own).
    skip_from = torch.where(own, place.index_select(0, self_index) - lo + first,
                            torch.iinfo(runs.dtype).max)
    t = torch.arange(rows.numel(), device=rows.device)
    at = (lo - first).index_select(0, rows).add_(t).add_(t >= skip_from.index_select(0, rows))
    return PositivePairs(rows, order.index_select(0, at))


def instance_pairs(pairs: Pairs) -> PositivePairs:
    """The other views of the same image (same sample id ≥ 0), bank rows included."""
    return _equal_key_pairs(pairs.anchor_ids, pairs.candidate_ids, pairs.self_index)


def _labels(pairs: Pairs) -> tuple[Tensor, Tensor]:
    """(anchor labels [A], candidate labels [M]).

    Raises:
        ValueError: either side without labels.
    """
    if pairs.anchor_labels is None or pairs.candidate_labels is None:
        raise ValueError("the label graph needs labels for every anchor and candidate")
    return pairs.anchor_labels, pairs.candidate_labels


def label_pairs(pairs: Pairs) -> PositivePairs:
    """Candidates with the anchor's label (SupCon's P(i)), other than the anchor; unlabelled
    (label −1) candidates never match."""
    return _equal_key_pairs(*_labels(pairs), pairs.self_index)


def _equal_key_mask(anchor_keys: Tensor, candidate_keys: Tensor, self_index: Tensor,
                    dtype: torch.dtype = torch.bool, anchors_known: bool = False) -> Tensor:
    """[A, M] ``dtype`` (bool, or a float dtype for 0/1): ``anchor_keys[i] == candidate_keys[j]
    >= 0`` and j ≠ ``self_index[i]`` — :func:`_equal_key_pairs` as a mask, by one
    whole-matrix compare (and for floats one conversion, through uint8: CPU kernels on
    bool matrices are several times slower than on bytes). ``anchors_known``: every anchor
    key is ≥ 0 (checked elsewhere), so equality alone decides."""
    same = anchor_keys[:, None] == candidate_keys[None, :]  # [A, M] bool
    if dtype == torch.bool:
        if not anchors_known:
            same.logical_and_((anchor_keys >= 0)[:, None])
        return same.scatter_(1, self_index[:, None], False)
    mask = same.view(torch.uint8).to(dtype)
    if not anchors_known:
        mask.mul_((anchor_keys >= 0).to(dtype)[:, None])
    return mask.scatter_(1, self_index[:, None], 0.0)


def instance_graph(pairs: Pairs) -> Tensor:
    """[A, M] bool: the other views of the same image (same sample id), bank rows included."""
    return _equal_key_mask(pairs.anchor_ids, pairs.candidate_ids, pairs.self_index)


def label_graph(pairs: Pairs) -> Tensor:
    """[A, M] bool: candidates with the anchor's label (SupCon's P(i)); unlabelled never match."""
    return _equal_key_mask(*_labels(pairs), pairs.self_index)


def _positive_mask(anchor_keys: Tensor, candidate_keys: Tensor, pairs: Pairs,
                   anchors_known: bool = False) -> PositiveMask:
    mask = _equal_key_mask(anchor_keys, candidate_keys, pairs.self_index, pairs.anchors.dtype,
                           anchors_known)
    return PositiveMask(mask, mask.sum(1))


def instance_positives(pairs: Pairs) -> PositiveMask | PositivePairs:
    """SimCLR's positives in the form the reducers read fastest at this size: a
    :class:`PositiveMask` (as :func:`instance_graph`) when ``pairs.dense_graphs``, else
    :func:`instance_pairs`."""
    if pairs.dense_graphs:
        return _positive_mask(pairs.anchor_ids, pairs.candidate_ids, pairs)
    return instance_pairs(pairs)


def label_positives(pairs: Pairs) -> PositiveMask | PositivePairs:
    """SupCon's P(i) in the form the reducers read fastest at this size: a
    :class:`PositiveMask` (as :func:`label_graph`) when ``pairs.dense_graphs``, else
    :func:`label_pairs`."""
    if pairs.dense_graphs:
        # the anchors' labels are their batch's, checked >= 0 (a failed check raises before
        # anything is stored), so -1 (an unlabelled bank row) matches none of them
        return _positive_mask(*_labels(pairs), pairs, anchors_known=True)
    return label_pairs(pairs)


def class_label_check(pairs: Pairs, num_classes: int) -> DeferredCheck | None:
    """The class-similarity graph's label check, on the device: one flag per side (anchors,
    candidates) set when a label lies outside ``[0, C)``; nothing is read here. An objective
    reads it with its loss statistics
    (:func:`components.objectives.global_means.fused_global_means`) and builds the graph with
    ``check=False``; None when there are no labels to check.

    Raises:
        ValueError: (now) anchors or candidates without labels; (``raise_failed``) a label
            outside ``[0, C)``, as :func:`class_similarity_graph`.
    """
    if pairs.anchor_labels is None or pairs.candidate_labels is None:
        raise ValueError("the class-similarity graph needs labels for anchors and candidates")
    sides = [(name, labels) for name, labels in (("anchor", pairs.anchor_labels),
                                                 ("candidate", pairs.candidate_labels))
             if labels.numel()]
    if not sides:
        return None

    def raise_failed(flags: Sequence[float]) -> None:
        for (name, labels), flag in zip(sides, flags, strict=True):
            if flag:  # the failure path: read the span for the message
                lo, hi = (int(x) for x in torch.stack(torch.aminmax(labels)).tolist())
                raise ValueError(
                    f"{name} labels span [{lo}, {hi}] but the class similarity matrix is "
                    f"{num_classes}×{num_classes}: labels must lie in [0, {num_classes})"
                )

    flags = []
    for _, labels in sides:
        lo, hi = torch.aminmax(labels)
        flags.append((lo < 0) | (hi >= num_classes))
    return DeferredCheck(torch.stack(flags), raise_failed)


def class_similarity_graph(pairs: Pairs, class_similarity: Tensor, check: bool = True) -> Tensor:
    """[A, M] float: ``G_ij = S[y_i, y_j]`` from a [C, C] class-similarity matrix (xclr.txt A.12).

    ``check=False``: the caller reads :func:`class_label_check` itself (with its loss
    statistics); labels outside ``[0, C)`` are then clamped into it here (so they index in
    bounds until that check raises). Labels inside are used as they are.

    Raises:
        ValueError: (``check=True``: one device read) a label outside ``[0, C)`` or an
            unlabelled candidate; anchors or candidates without labels.
    """
    if pairs.anchor_labels is None or pairs.candidate_labels is None:
        raise ValueError("the class-similarity graph needs labels for anchors and candidates")
    c = class_similarity.shape[0]
    if check and (deferred := class_label_check(pairs, c)) is not None:
        deferred.apply()
    sim = class_similarity.to(pairs.anchors.device, pairs.anchors.dtype)
    # clamp: the identity on valid labels; an out-of-range index is a device assert on CUDA
    return sim[pairs.anchor_labels.clamp(0, c - 1)][:, pairs.candidate_labels.clamp(0, c - 1)]


def caption_similarity_graph(pairs: Pairs) -> Tensor:
    """[A, M] float: cosine similarity of caption embeddings (xclr.txt Sec. 2.2, G^soft)."""
    if pairs.anchor_captions is None or pairs.candidate_captions is None:
        raise ValueError("the caption graph needs caption embeddings for anchors and candidates")
    return pairs.anchor_captions @ pairs.candidate_captions.T


def soft_targets(similarity: Tensor, pairs: Pairs, tau_s: float) -> Tensor:
    """X-CLR targets ``t_ij = softmax_{j≠i}(G_ij / tau_s)`` [A, M] float32, rows sum to 1.

    Computed in float32 with the own column at finfo.min, so tau_s = 1e-3 stays finite.
    The targets carry no gradient (a graph from captions or labels is data, not a model).
    """
    with torch.no_grad():  # the graph is a fixed target: no gradient, so work in place
        scaled = at_least_fp32(similarity).div(tau_s)
        own = pairs.self_index[:, None]
        scaled.scatter_(1, own, torch.finfo(scaled.dtype).min)
        # softmax in place (max-shifted, so exp never overflows): no second A×M buffer.
        # Inputs are floored where exp leaves the normal range (e^−87 in float32): below it
        # CPU exp takes a slow path, ~100× per element, and at τ_s ≈ 0.01 most of a row is
        # there (G/τ_s spans 100 per unit of similarity). Those targets were < 1.6e−38 of a
        # row summing to ≥ 1 and stay that small; the own column is set back to 0.
        floor = math.ceil(math.log(torch.finfo(scaled.dtype).tiny))
        scaled.sub_(scaled.amax(dim=1, keepdim=True)).clamp_min_(floor).exp_()
        scaled.scatter_(1, own, 0.0)
        return scaled.div_(scaled.sum(dim=1, keepdim=True))

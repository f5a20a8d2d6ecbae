"""Weighted k-nearest-neighbour classifier on frozen embeddings (Wu et al. 2018).

References:
    Z. Wu, Y. Xiong, S. X. Yu, D. Lin. "Unsupervised feature learning via non-parametric
    instance discrimination", CVPR 2018, Sec. 3.5 ("weighted kNN classifier").
    Used to evaluate the learned embeddings by SINCERE (sincere.txt App. M: "As in Wu et al.
    (2018), cosine similarity is used to choose the nearest neighbors and to weight votes",
    accuracy reported for k = 1 and 5) and by X-CLR (xclr.txt Fig. 3b, a range of k).

Formula. Train features ``x_1..x_N`` with labels ``y_1..y_N ∈ {0..C-1}``, a query ``q``:

    s_j       = cos(q, x_j) = <q / ‖q‖, x_j / ‖x_j‖>            (float32)
    N_k(q)    = indices of the k largest s_j                     (torch.topk order on ties)
    score_c   = Σ_{j ∈ N_k(q)} [y_j = c] · exp(s_j / τ)           (τ = temperature, 0.07 in Wu)
    predict   = argmax_c score_c

Features are L2-normalised inside, so scaling any row by a positive constant changes nothing;
an all-zero row has cosine 0 with everything. Top-k is computed once with ``max(k)`` (sorted,
descending) and the scores for every smaller k come from its first k columns, so a list of k
costs one pass over the train set.

Ties. Neighbours with exactly equal similarity at the k-th place, and classes with exactly
equal scores in :func:`knn_accuracy`, are broken by :func:`torch.topk`, whose order among
equal values is implementation-defined (it can differ between CPU and CUDA). In particular,
when fewer than ``t`` classes received a vote, the top-``t`` set is filled with score-0 classes
in that unspecified order.

Overflow. Since ``s_j ≤ 1``, ``score_c ≤ k · exp(1/τ)``; float32 holds it only if
``1/τ + ln k < ln(float32 max) ≈ 88.72`` (τ > 0.0113 for k = 1, τ > 0.0120 for k = 200).
Smaller temperatures are rejected instead of returning ``inf`` scores that tie.

Memory: the train features are copied once as float32 [N, D]; queries are processed in chunks
of ``chunk_size`` rows, so the similarity buffer is [chunk_size, N] float32 plus the
[chunk_size, max(k)] top-k values/indices and one [chunk_size, C] score matrix per k.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from components.evaluation import checks

__all__ = ["KnnRule", "knn_accuracy", "knn_correct", "knn_hits", "knn_top1", "nearest",
           "sharded_knn_correct", "sharded_knn_top1", "weighted_knn_predict"]

_LOG_F32_MAX = math.log(torch.finfo(torch.float32).max)  # ≈ 88.7228


@dataclasses.dataclass(frozen=True)
class KnnRule:
    """What "kNN top-1" means in simgraph: one definition, from a run's ``knn`` section
    (:meth:`of`), used by the online monitor (:func:`sharded_knn_correct`), ``simgraph
    evaluate`` and a sweep's confirmation (:meth:`scores` / :meth:`hits`) alike, and named in
    every report (:meth:`name`: ``kNN top-1 (k=200, τ=0.07, weighted)``).

    The ``k`` nearest ``bank_split`` images by cosine of the backbone features (the
    unaugmented evaluation view) vote for each query with weight ``exp(cos / temperature)``
    (Wu et al. 2018); the prediction is the class with the largest vote. ``k`` is capped at
    the bank's size. What the queries are (the online monitor's ``knn.query_split``, the
    evaluation's test split, a confirmation's ``confirm.split``) is said beside the number
    (:meth:`describe`).

    Raises:
        ValueError: ``k`` < 1 or ``temperature`` not a finite number > 0.
    """

    k: int = 200
    temperature: float = 0.07
    bank_split: str = "train"

    def __post_init__(self) -> None:
        if not (isinstance(self.k, int) and not isinstance(self.k, bool) and self.k >= 1):
            raise ValueError(f"k={self.k!r} is not allowed: the kNN rule needs k >= 1")
        t = self.temperature
        if not (isinstance(t, int | float) and math.isfinite(t) and t > 0):
            raise ValueError(f"temperature={t!r} is not allowed: it must be a finite number > 0")

    @classmethod
    def of(cls, knn: Any) -> KnnRule:
        """The rule of a run's ``knn`` section (:class:`~components.config.KNNConfig`)."""
        return cls(k=int(knn.k), temperature=float(knn.temperature),
                   bank_split=str(knn.bank_split))

    def name(self, k: int | None = None) -> str:
        """``kNN top-1 (k=200, τ=0.07, weighted)`` (``k``: the k actually used, when the bank
        is smaller than the rule's)."""
        return f"kNN top-1 (k={self.k if k is None else k}, τ={self.temperature:g}, weighted)"

    def describe(self, query_split: str, k: int | None = None) -> str:
        """:meth:`name` with what it is measured on."""
        return f"{self.name(k)} of the {query_split} images against the {self.bank_split} bank"

    def as_dict(self, k: int | None = None) -> dict[str, Any]:
        """The rule as reports record it (``metrics.json``)."""
        return {"k": self.k if k is None else k, "temperature": self.temperature,
                "votes": "weighted", "bank_split": self.bank_split, "name": self.name(k)}

    def k_for(self, bank_size: int) -> int:
        """The k used against a bank of ``bank_size`` rows: ``min(k, bank_size)``."""
        return min(self.k, bank_size)

    def scores(self, bank_features: Tensor, bank_labels: Tensor, query_features: Tensor,
               num_classes: int, ks: Sequence[int] = ()) -> dict[int, Tensor]:
        """:func:`weighted_knn_predict` at this rule's temperature, for the rule's k (capped
        at the bank) and any further ``ks`` (a curve of k scored the same way)."""
        k = self.k_for(bank_features.shape[0])
        return weighted_knn_predict(bank_features, bank_labels, query_features,
                                    sorted({k, *ks}), num_classes,
                                    temperature=self.temperature)

    def hits(self, bank_features: Tensor, bank_labels: Tensor, query_features: Tensor,
             query_labels: Tensor, num_classes: int) -> Tensor:
        """[Q] bool: whether the rule classifies each query right (its mean is the rule's kNN
        top-1)."""
        k = self.k_for(bank_features.shape[0])
        scores = self.scores(bank_features, bank_labels, query_features, num_classes)[k]
        return knn_hits(scores, query_labels.to(scores.device), 1)

    def sharded_correct(self, bank: tuple[Tensor, Tensor], queries: tuple[Tensor, Tensor],
                        num_classes: int) -> tuple[int, int]:
        """:func:`sharded_knn_correct` under this rule (the online monitor, every rank)."""
        return sharded_knn_correct(bank, queries, k=self.k, num_classes=num_classes,
                                   temperature=self.temperature)


def _ks(k: int | Sequence[int]) -> list[int]:
    """``k`` as a non-empty sorted list of distinct integers ≥ 1."""
    values = [k] if not isinstance(k, Sequence) else list(k)
    if not values:
        raise ValueError("k=[] is empty; pass an integer ≥ 1 or a non-empty sequence of them")
    ks = sorted({checks.as_int("k", v) for v in values})
    if ks[0] < 1:
        raise ValueError(f"k={ks[0]} is not allowed; every k must be ≥ 1")
    return ks


_UNLABELLED_HINT = "-1 marks unlabelled samples: drop those rows before kNN"


def _check_labels(name: str, labels: Tensor, rows: int, num_classes: int) -> None:
    """``labels`` is [rows] integer class ids in ``[0, num_classes)`` (no unlabelled -1)."""
    checks.check_labels(name, labels, rows, num_classes, hint=_UNLABELLED_HINT)


def _check_temperature(temperature: float, k_max: int) -> None:
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)):
        raise ValueError(f"temperature={temperature!r} must be a finite number > 0")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} is not allowed; it must be > 0")
    # score_c ≤ k · exp(1/τ) must stay finite in float32 (see module docstring).
    if 1.0 / temperature + math.log(k_max) >= _LOG_F32_MAX:
        bound = 1.0 / (_LOG_F32_MAX - math.log(k_max))
        raise ValueError(
            f"temperature={temperature} overflows float32 scores (k·exp(1/τ) with k={k_max}); "
            f"allowed: temperature > {bound:.5f}"
        )


@torch.no_grad()
def weighted_knn_predict(
    train_features: Tensor,
    train_labels: Tensor,
    query_features: Tensor,
    k: int | Sequence[int],
    num_classes: int,
    temperature: float = 0.07,
    chunk_size: int = 1024,
    exclude_self: bool = False,
) -> dict[int, Tensor]:
    """Class scores of Wu et al.'s weighted kNN classifier, for one or several k.

    ``score[q, c] = Σ_{j ∈ topk_j cos(q, x_j)} [y_j = c] · exp(cos(q, x_j) / temperature)``
    (module docstring). Runs without autograd and in float32 even under autocast, on the
    device of ``train_features``.

    Args:
        train_features: [N, D] float, any scale (rows are L2-normalised inside).
        train_labels: [N] integer class ids in ``[0, num_classes)``.
        query_features: [Q, D] float, same device as ``train_features``.
        k: number of neighbours, or a sequence of them (each 1 ≤ k ≤ N, or ≤ N - 1 with
            ``exclude_self``). Top-k is computed once for ``max(k)``.
        num_classes: C ≥ 1.
        temperature: τ > 0 of the vote weight ``exp(s / τ)`` (0.07 as Wu et al.); bounded
            below so the scores stay finite in float32 (module docstring).
        chunk_size: queries per chunk; memory is O(chunk_size · N).
        exclude_self: the queries *are* the train set (row i of both is the same sample):
            query i never votes for itself (its diagonal similarity is masked). Requires Q == N.

    Returns:
        ``{k: scores}`` for every distinct k, ``scores`` a detached [Q, C] float32 tensor.

    Raises:
        ValueError: wrong shapes/dtypes, mismatched D or device, non-finite features, labels
            outside ``[0, num_classes)`` (the count is named), k < 1 or k > N (N - 1 with
            exclude_self), ``exclude_self`` with Q != N, num_classes < 1, chunk_size < 1,
            temperature ≤ 0 or too small for float32.
    """
    checks.check_features("train_features", train_features)
    checks.check_features("query_features", query_features)
    n = train_features.shape[0]
    q = query_features.shape[0]
    checks.check_same_width("query_features", query_features, "train_features", train_features)
    checks.check_same_device("query_features", query_features, "train_features", train_features)
    num_classes = checks.at_least_one("num_classes", num_classes)
    chunk_size = checks.at_least_one("chunk_size", chunk_size)
    ks = _ks(k)
    k_max = ks[-1]
    if exclude_self and q != n:
        raise ValueError(
            f"exclude_self=True needs the queries to be the train set, but Q={q} != N={n}"
        )
    available = n - 1 if exclude_self else n
    if k_max > available:
        what = "N - 1 (exclude_self)" if exclude_self else "N"
        raise ValueError(
            f"k={k_max} is larger than the {available} available neighbours; "
            f"allowed: 1 ≤ k ≤ {what} = {available}"
        )
    _check_temperature(temperature, k_max)
    _check_labels("train_labels", train_labels, n, num_classes)

    device = train_features.device
    labels = train_labels.to(device=device, dtype=torch.int64)  # [N]
    out = {kk: torch.zeros(q, num_classes, dtype=torch.float32, device=device) for kk in ks}
    if q == 0:
        return out

    with torch.autocast(device_type=device.type, enabled=False):
        train = F.normalize(train_features.float(), dim=1)  # [N, D] unit rows (0-rows stay 0)
        for start in range(0, q, chunk_size):
            stop = min(start + chunk_size, q)
            query = F.normalize(query_features[start:stop].float(), dim=1)  # [B, D]
            sim = query @ train.T  # [B, N] cosine similarities
            if exclude_self:
                rows = torch.arange(stop - start, device=device)  # [B]
                sim[rows, rows + start] = float("-inf")  # query i is train row i
            top_sim, top_idx = sim.topk(k_max, dim=1, largest=True, sorted=True)  # [B, k_max]
            weights = torch.exp(top_sim / temperature)  # [B, k_max] vote weights
            votes = labels[top_idx]  # [B, k_max] neighbour labels
            scores = torch.zeros(stop - start, num_classes, dtype=torch.float32, device=device)
            done = 0
            for kk in ks:  # ascending: add neighbours done..kk-1 to the running scores
                scores.scatter_add_(1, votes[:, done:kk], weights[:, done:kk])  # [B, C]
                out[kk][start:stop] = scores
                done = kk
    return out


def _hits(scores: Tensor, labels: Tensor, t: int) -> Tensor:
    """[Q] bool: is ``labels[i]`` among the ``min(t, C)`` highest ``scores[i]`` (torch.topk)?"""
    top = scores.topk(min(t, scores.shape[1]), dim=1).indices  # [Q, t]
    return (top == labels[:, None]).any(dim=1)


@torch.no_grad()
def knn_hits(scores: Tensor, labels: Tensor, t: int = 1) -> Tensor:
    """[Q] bool per query: its label is among the top ``t`` classes of ``scores`` [Q, C] —
    the per-image outcomes that :func:`knn_accuracy` averages and intervals resample.

    Raises:
        ValueError: as :func:`knn_accuracy`.
    """
    _check_scores(scores, labels)
    t = checks.at_least_one("t", t)
    return _hits(scores, labels.to(device=scores.device, dtype=torch.int64), t)


def _check_scores(scores: Tensor, labels: Tensor) -> None:
    if not isinstance(scores, Tensor) or scores.dim() != 2 or scores.shape[1] < 1:
        shape = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(f"scores has shape {shape}; expected a 2-D [Q, C] tensor with C ≥ 1")
    _check_labels("labels", labels, scores.shape[0], scores.shape[1])


@torch.no_grad()
def knn_accuracy(scores: Tensor, labels: Tensor, topk: Sequence[int] = (1, 5)) -> dict[int, float]:
    """Top-t accuracy of class scores: fraction of queries whose label is in the top t.

    Args:
        scores: [Q, C] class scores (e.g. one value of :func:`weighted_knn_predict`), Q ≥ 1.
        labels: [Q] integer labels in ``[0, C)``, on any device (moved to ``scores``').
        topk: the t values (each ≥ 1). ``t > C`` is clamped to C, which gives 1.0.

    Returns:
        ``{t: accuracy in [0, 1]}``. Equal scores are ranked by :func:`torch.topk` (module
        docstring, "Ties"): e.g. with one voted class, top-5 also holds 4 unspecified
        score-0 classes.

    Raises:
        ValueError: wrong shapes/dtypes, Q == 0, labels outside ``[0, C)``, t < 1.
    """
    _check_scores(scores, labels)
    if scores.shape[0] == 0:
        raise ValueError("scores has Q=0 rows; accuracy needs at least one query")
    ts = [checks.as_int("topk", t) for t in topk]
    if not ts:
        raise ValueError("topk=() is empty; pass at least one t ≥ 1")
    if min(ts) < 1:
        raise ValueError(f"topk={min(ts)} is not allowed; every t must be ≥ 1")
    labels = labels.to(device=scores.device, dtype=torch.int64)  # [Q]
    q = scores.shape[0]
    return {t: int(_hits(scores, labels, t).sum()) / q for t in ts}  # exact count / Q


@torch.no_grad()
def knn_correct(
    train_features: Tensor,
    train_labels: Tensor,
    query_features: Tensor,
    query_labels: Tensor,
    k: int,
    num_classes: int,
    temperature: float = 0.07,
    chunk_size: int = 1024,
) -> tuple[int, int]:
    """(number of queries predicted correctly at top-1, number of queries), for all_reduce.

    Distributed evaluation: every rank holds the full train set (bank) and its shard of the
    queries; summing both counts over ranks and dividing gives the accuracy on all queries,
    exactly as one process would (the prediction of a query does not depend on the others).
    A rank with no queries returns (0, 0).

    k is clamped to ``min(k, N)``: the online monitor runs on tiny data too, where N < 200;
    with N ≥ k this is exactly :func:`weighted_knn_predict` with k. The prediction is the
    top-1 class by :func:`torch.topk` (ties: module docstring).

    Raises:
        ValueError: as :func:`weighted_knn_predict` (k < 1, N == 0, bad labels, …), and for
            query labels that are not [Q] or lie outside ``[0, num_classes)``.
    """
    checks.check_features("train_features", train_features)
    checks.check_features("query_features", query_features)
    n, q = train_features.shape[0], query_features.shape[0]
    k = checks.at_least_one("k", k)
    if n == 0:
        raise ValueError("train_features has N=0 rows; kNN needs at least one train sample")
    num_classes = checks.at_least_one("num_classes", num_classes)
    _check_labels("query_labels", query_labels, q, num_classes)
    k_used = min(k, n)
    scores = weighted_knn_predict(
        train_features,
        train_labels,
        query_features,
        k_used,
        num_classes,
        temperature=temperature,
        chunk_size=chunk_size,
    )[k_used]  # [Q, C]
    labels = query_labels.to(device=scores.device, dtype=torch.int64)  # [Q]
    return int(_hits(scores, labels, 1).sum()), q


def knn_top1(
    train_features: Tensor,
    train_labels: Tensor,
    query_features: Tensor,
    query_labels: Tensor,
    k: int = 200,
    *,
    num_classes: int,
    temperature: float = 0.07,
    chunk_size: int = 1024,
) -> float:
    """Top-1 weighted-kNN accuracy in [0, 1]: the online monitor run each pretraining epoch.

    k = 200 and τ = 0.07 as Wu et al.; k is clamped to ``min(k, N)`` (see
    :func:`knn_correct`, which this divides: correct / queries).

    Raises:
        ValueError: as :func:`knn_correct`, and Q == 0 (accuracy undefined).
    """
    correct, total = knn_correct(
        train_features,
        train_labels,
        query_features,
        query_labels,
        k,
        num_classes,
        temperature=temperature,
        chunk_size=chunk_size,
    )
    if total == 0:
        raise ValueError("query_features has Q=0 rows; accuracy needs at least one query")
    return correct / total


@torch.no_grad()
def nearest(
    train_features: Tensor, train_labels: Tensor, query_features: Tensor, k: int,
    chunk_size: int = 1024,
) -> tuple[Tensor, Tensor]:
    """Each query's ``k`` nearest train rows by cosine: ``([Q, k] similarities, descending,
    float32; [Q, k] their labels int64)``. Fewer than ``k`` train rows: the missing columns
    hold ``-inf`` similarity (a vote weight of 0) and label 0, so shards of any size combine
    (:func:`sharded_knn_top1`). Same float32 arithmetic as :func:`weighted_knn_predict`."""
    n, q, device = train_features.shape[0], query_features.shape[0], query_features.device
    sims = torch.full((q, k), float("-inf"), dtype=torch.float32, device=device)
    labels = torch.zeros(q, k, dtype=torch.int64, device=device)
    kk = min(k, n)
    if kk == 0 or q == 0:
        return sims, labels
    train_labels = train_labels.to(device=device, dtype=torch.int64)
    with torch.autocast(device_type=device.type, enabled=False):
        train = F.normalize(train_features.float(), dim=1)  # [N, D]
        for start in range(0, q, chunk_size):
            stop = min(start + chunk_size, q)
            query = F.normalize(query_features[start:stop].float(), dim=1)  # [B, D]
            top_sim, top_idx = (query @ train.T).topk(kk, dim=1, largest=True, sorted=True)
            sims[start:stop, :kk] = top_sim
            labels[start:stop, :kk] = train_labels[top_idx]
    return sims, labels


@torch.no_grad()
def sharded_knn_top1(
    bank: tuple[Tensor, Tensor], queries: tuple[Tensor, Tensor], *, k: int, num_classes: int,
    temperature: float = 0.07, chunk_size: int = 1024,
) -> float:
    """The accuracy of :func:`sharded_knn_correct` (``correct / queries``)."""
    correct, total = sharded_knn_correct(bank, queries, k=k, num_classes=num_classes,
                                         temperature=temperature, chunk_size=chunk_size)
    return correct / total


@torch.no_grad()
def sharded_knn_correct(
    bank: tuple[Tensor, Tensor], queries: tuple[Tensor, Tensor], *, k: int, num_classes: int,
    temperature: float = 0.07, chunk_size: int = 1024,
) -> tuple[int, int]:
    """(queries right, queries) of :func:`knn_top1` over every rank's queries against every
    rank's bank rows, without gathering the bank.

    Each rank holds a shard of the bank ``([n_r, D] features, [n_r] labels)`` and of the
    queries. The queries are gathered (the val split: small beside the train bank — at
    ImageNet scale the gathered bank would be ~10 GB of float32 per GPU), every rank finds
    each query's ``k`` nearest rows of its own shard (:func:`nearest`), those ``[Q, k]``
    candidates are gathered, and the ``k`` best of the ``W·k`` are the global top-k: the vote
    of one process over the concatenated bank, up to the order of exactly equal similarities.
    Every rank returns the same value. Without a process group: :func:`knn_top1`.

    Raises:
        ValueError: as :func:`knn_top1` (no bank row or no query over all ranks, bad labels,
            a temperature too small for float32).
    """
    from components.runtime import distributed

    bank_f, bank_y = bank
    checks.check_features("bank features", bank_f)
    checks.check_features("query features", queries[0])
    k = checks.at_least_one("k", k)
    num_classes = checks.at_least_one("num_classes", num_classes)
    _check_labels("bank labels", bank_y, bank_f.shape[0], num_classes)
    query_f = distributed.gather(queries[0].contiguous(), grad=False)  # [Q, D]
    query_y = distributed.gather(queries[1].to(query_f.device).contiguous(), grad=False)
    _check_labels("query labels", query_y, query_f.shape[0], num_classes)
    n = int(distributed.all_reduce_sum(torch.tensor(  # bank rows over all ranks
        [bank_f.shape[0]], dtype=torch.int64, device=query_f.device))[0])
    q = query_f.shape[0]
    if n == 0:
        raise ValueError("the kNN bank has N=0 rows on every rank; kNN needs at least one")
    if q == 0:
        raise ValueError("query_features has Q=0 rows; accuracy needs at least one query")
    k_used = min(k, n)
    _check_temperature(temperature, k_used)
    sims, labels = nearest(bank_f.to(query_f.device), bank_y, query_f, k_used, chunk_size)
    world = distributed.world_size()
    # [W·Q, k] rank-major → [Q, W·k]: every rank's candidates for each query side by side.
    all_sims = distributed.gather(sims, grad=False).view(world, q, k_used).permute(1, 0, 2)
    all_labels = distributed.gather(labels, grad=False).view(world, q, k_used).permute(1, 0, 2)
    top_sim, pick = all_sims.reshape(q, -1).topk(k_used, dim=1, largest=True, sorted=True)
    votes = all_labels.reshape(q, -1).gather(1, pick)  # [Q, k]
    scores = torch.zeros(q, num_classes, dtype=torch.float32, device=query_f.device)
    scores.scatter_add_(1, votes, torch.exp(top_sim / temperature))  # [Q, C]
    correct = _hits(scores, query_y.to(torch.int64), 1).sum()
    return int(correct), q

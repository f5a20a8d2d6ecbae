"""What one run's evaluation holds: :class:`RunEval` (every metric of a checkpoint, per image
where intervals resample it), its 95 % intervals and its ``metrics.json`` summary, the paired
difference of two runs scored on the same images (:func:`paired_differences`), and the k the
interval tables show (:func:`headline_k`). Computed by
:func:`components.runs.evaluate.evaluate_run`; written by :mod:`components.evaluation.report`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from components.evaluation.baseline import Baseline
from components.evaluation.intervals import (
    CONFIDENCE,
    RESAMPLES,
    Interval,
    margin_interval,
    mean_interval,
    paired_margin_difference,
    paired_mean_difference,
)

if TYPE_CHECKING:  # torch loads only when a run is evaluated
    from components.evaluation.visuals import ClassRecall, EmbeddingMap, NeighbourGrid

MAP_CSV = "embedding_map.csv"


@dataclasses.dataclass(kw_only=True)
class RunEval:
    name: str
    run_dir: str  # a path or URI
    loss: str
    params: dict[str, Any]
    epoch: int
    knn: dict[int, dict[str, float]]  # k -> {"top1", "top5"}
    probe: dict[str, Any]
    separation: dict[str, float]
    graph: dict[str, float]
    learned_similarity: np.ndarray  # [C, C]
    target_similarity: np.ndarray | None
    target_sims: np.ndarray  # [M] SINCERE target similarities
    noise_sims: np.ndarray
    classes: list[str]
    feature: str
    label_set: str | None = None  # a label-map file (``--labels``); None = the dataset's
    # Per query image, in the query split's order (what intervals and paired differences
    # resample): kNN top-1 hits per k, the probe's top-1 hits, and the query labels.
    knn_hits: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)
    probe_hits: np.ndarray | None = None
    query_labels: np.ndarray | None = None
    query_split: str = "test"
    # kNN top-1 recall per label at the headline k, worst first; what the report draws.
    per_class: list[ClassRecall] = dataclasses.field(default_factory=list)
    embedding_map: EmbeddingMap | None = None
    neighbours: NeighbourGrid | None = None
    baseline: Baseline | None = None  # the random-init encoder; None with --no-baseline
    # The one kNN rule (components.evaluation.knn.KnnRule, from the run's knn section) as
    # used here (its k capped at the bank): every kNN number above is scored with its τ and
    # bank; `knn_top1` is the rule's own (its k), the number the online monitor and a sweep's
    # confirmation report.
    knn_rule: dict[str, Any] = dataclasses.field(default_factory=dict)
    knn_top1: float | None = None

    @property
    def knn_k(self) -> int | None:
        """The rule's k as used (``None``: no rule recorded)."""
        k = self.knn_rule.get("k")
        return int(k) if k is not None else None

    def knn_headline(self) -> str:
        """``kNN top-1 (k=200, τ=0.07, weighted) of the test images against the train bank:
        71.3 % [69.0, 73.5]``."""
        if self.knn_top1 is None or self.knn_k is None:
            return ""
        from components.evaluation.knn import KnnRule  # torch: only when a run has a rule

        iv = mean_interval(self.knn_hits[self.knn_k])
        rule = KnnRule(k=self.knn_k, temperature=float(self.knn_rule["temperature"]),
                       bank_split=str(self.knn_rule["bank_split"]))  # as recorded (k as used)
        return (f"{rule.describe(self.query_split)}: {100 * self.knn_top1:.1f} % "
                f"[{100 * iv.low:.1f}, {100 * iv.high:.1f}]")

    def intervals(self) -> dict[str, Interval]:
        """95 % bootstrap intervals over the query images: ``knn@k`` (top-1), ``probe``
        (top-1) and ``margin`` (SINCERE's median margin)."""
        out = {f"knn@{k}": mean_interval(h) for k, h in sorted(self.knn_hits.items())}
        if self.probe_hits is not None:
            out["probe"] = mean_interval(self.probe_hits)
        out["margin"] = margin_interval(self.target_sims, self.noise_sims)
        return out

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "run": self.name, "loss": self.loss, "params": self.params, "epoch": self.epoch,
            "feature": self.feature, "labels": self.label_set or "dataset classes",
            "knn_rule": self.knn_rule,
            "knn_top1": {"value": self.knn_top1, "rule": self.knn_rule.get("name"),
                         "split": self.query_split},
            "knn": {str(k): v for k, v in self.knn.items()},
            "probe": self.probe, "separation": self.separation, "graph": self.graph,
            "intervals": {k: iv.as_dict() for k, iv in self.intervals().items()},
            "interval_method": f"{int(100 * CONFIDENCE)} % percentile bootstrap over the "
                               f"{0 if self.query_labels is None else len(self.query_labels)} "
                               f"query images ({RESAMPLES} resamples)",
            "query_split": self.query_split,
            "per_class_knn": {"k": headline_k([self]),
                              "classes": [r.as_dict() for r in self.per_class]},
        }
        if self.embedding_map is not None:
            m = self.embedding_map
            out["embedding_map"] = {"method": "t-SNE", "points": len(m), "of": m.total,
                                    "perplexity": m.perplexity, "pca_dims": m.pca_dims,
                                    "file": MAP_CSV}
        if self.neighbours is not None:
            g = self.neighbours
            out["neighbours"] = {"queries": g.queries.tolist(),
                                 "neighbours": g.neighbours.tolist(),
                                 "wrong": int(g.wrong.sum())}
        if self.baseline is not None:
            gain = self.baseline.gain(self.knn_hits, self.probe_hits)
            out["baseline"] = {**self.baseline.as_dict(),
                               "gain": {k: iv.as_dict() for k, iv in gain.items()}}
        return out


def paired_differences(a: RunEval, b: RunEval) -> dict[str, Interval] | None:
    """``a`` minus ``b`` for every interval metric both have, paired over the query images
    (``None`` when they were not scored on the same images: other data or label sets)."""
    if (a.query_labels is None or b.query_labels is None
            or not np.array_equal(a.query_labels, b.query_labels)
            or a.label_set != b.label_set):
        return None
    out = {f"knn@{k}": paired_mean_difference(a.knn_hits[k], b.knn_hits[k])
           for k in sorted(set(a.knn_hits) & set(b.knn_hits))}
    if a.probe_hits is not None and b.probe_hits is not None:
        out["probe"] = paired_mean_difference(a.probe_hits, b.probe_hits)
    out["margin"] = paired_margin_difference((a.target_sims, a.noise_sims),
                                             (b.target_sims, b.noise_sims))
    return out


def headline_k(evals: Sequence[RunEval]) -> int | None:
    """The k the interval tables show: 20 (the parity benches' kNN@20), else the largest k
    every run has below it, else the smallest."""
    common = sorted(set.intersection(*(set(e.knn_hits) for e in evals))) if evals else []
    return headline_of(common)


def headline_of(ks: Sequence[int]) -> int | None:
    """:func:`headline_k` of one list of k."""
    if not ks:
        return None
    below = [k for k in sorted(ks) if k <= 20]
    return below[-1] if below else min(ks)

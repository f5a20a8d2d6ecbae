"""``simgraph evaluate RUN_DIR [RUN_DIR ...] [--checkpoint PATH] [--projector] [--out DIR]
[--labels MAP.yaml] [--no-baseline] [--device cpu|cuda:N]``.

For each run, top to bottom:

1. Load the run's ``config.yaml`` and a checkpoint (the newest complete one, or
   ``--checkpoint``); refuse a checkpoint written under another config and a dataset dir
   whose content differs from the one the run trained on (checkpoints record its identity).
2. Extract frozen features (backbone, or projector with ``--projector``) of one centre view of
   every image of the bank split (train) and the query split (test, else val), batched, with
   a progress bar; on ``--device`` (default: ``cuda:0`` when torch sees a GPU, else the CPU;
   :func:`components.data.reader.resolve_device`).
3. Metrics (``components/evaluation``): weighted kNN (Wu et al. 2018, votes exp(cos/0.07)) for
   k ∈ {1, 5, 10, 20, 50, 100, 200}, top-1/top-5; a linear probe on standardised features;
   SINCERE's target–noise separation (median margin, overlap); label error and intra-class
   connectivity of the test kNN graph (definitions in ``components/evaluation/graph.py``);
   learned class-similarity matrix next to the target one (X-CLR Fig. 4); per-class kNN
   recall, a t-SNE map of the query features and a grid of nearest neighbours
   (``components/evaluation/visuals.py``).
4. Unless ``--no-baseline``: the same features and the kNN (headline k) and probe of the
   random-init encoder of the run's config (the weights it started from,
   ``components/evaluation/baseline.py``): a ``random init`` row in every table and the run's
   paired gain over it.
5. Write ``<run>/eval/report.md``, ``metrics.json``, PNG plots and ``embedding_map.csv``
   (``<run>/eval-<map>/`` when ``--labels`` scores the run against groups of its classes:
   every metric then uses the group as the label). With several runs, also a
   comparison table and overlaid plots in ``--out`` (default: ``<storage>/comparison``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from components.config import PretrainConfig
from components.errors import run_command
from components.evaluation.baseline import BASELINE, Baseline
from components.evaluation.intervals import (
    CONFIDENCE,
    RESAMPLES,
    Interval,
    fmt,
    margin_interval,
    mean_interval,
    paired_margin_difference,
    paired_mean_difference,
)
from components.io.files import write_text
from components.runs.scoring import (  # noqa: F401  (evaluate's API: tests and bench use them)
    EvaluateError,
    eval_loader,
    load_run,
    run_dataset,
    split_features,
    split_knn_hits,
)

if TYPE_CHECKING:  # torch and the readers load only when a run is evaluated
    from components.evaluation.visuals import ClassRecall, EmbeddingMap, NeighbourGrid

KS = (1, 5, 10, 20, 50, 100, 200)
MAP_CSV = "embedding_map.csv"
PER_CLASS_ROWS = 30  # the report lists the worst classes; metrics.json has every class
# Hyperparameters worth a column in the comparison table, when the loss has them.
KEY_PARAMS = ("tau", "tau_s", "graph", "epsilon", "variant", "lambda_sup", "lambda_dc",
              "tau_sup", "tau_dc", "bank_size", "top_n")


@dataclasses.dataclass
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
        from components.evaluation.knn import KnnRule

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


# ---------------------------------------------------------------------------------------------
# Loading.


# ---------------------------------------------------------------------------------------------
# One run.


def evaluate_run(run_dir: str | Path, checkpoint: str | Path | None = None, *,
                 projector: bool = False, device: str | None = None, jit: bool | None = None,
                 probe_epochs: int = 100, labels: str | Path | None = None,
                 baseline: bool = True) -> RunEval:
    """Every metric of one run (see the module docstring); nothing written. ``labels``: a
    label map (``components.evaluation.labels``) to score against groups of the classes
    instead of the classes themselves (no retraining). ``baseline``: also score the
    random-init encoder of the run's config (its features, kNN at the headline k, probe).
    ``device``: ``cpu`` / ``cuda`` / ``cuda:N``; ``None``: from the resources this process was
    given (:func:`~components.data.reader.resolve_device`)."""
    import torch

    from components.data.reader import resolve_device, set_jit
    from components.evaluation.baseline import random_init_model, score_baseline
    from components.evaluation.graph import (
        class_similarity_matrix,
        graph_metrics,
        target_noise_separation,
    )
    from components.evaluation.knn import KnnRule, knn_accuracy, knn_hits
    from components.evaluation.labels import LabelMapError, load_label_map
    from components.evaluation.probe import linear_probe
    from components.evaluation.visuals import (
        embedding_map,
        nearest_neighbours,
        per_class_recall,
        pick_queries,
        with_images,
    )
    from components.io.storage import basename
    from components.training.step import build_model

    dev = resolve_device(device)  # a bad --device: before anything loads
    cfg, state, _ = load_run(run_dir, checkpoint)
    name = basename(str(run_dir))
    info = run_dataset(cfg, state)
    classes, index = list(info.classes), torch.arange(len(info.classes))
    if labels is not None:
        try:
            classes, index = load_label_map(labels, info.classes)
        except LabelMapError as e:
            raise EvaluateError(str(e)) from None
    set_jit(cfg.data.jit if jit is None else jit)
    sim = info.class_similarity()
    sim_t = None if sim is None else torch.as_tensor(sim, dtype=torch.float32)
    model, _ = build_model(cfg.model, cfg.loss, len(info.classes), sim_t, info.caption_dim)
    model.load_state_dict(state.model)
    encoder = model.encoder.to(dev)
    query_split = "test" if info.splits.get("test", 0) else "val"
    rule = KnnRule.of(cfg.knn)  # the one kNN rule: the online monitor's and confirmation's
    bank_split = rule.bank_split
    # One loader per split for everything below (trained and random-init features, the
    # neighbour grid's images): FFCV compiles each new loader (15-45 s with data.jit).
    loaders = {s: eval_loader(cfg, info, s, dev) for s in (bank_split, query_split)}

    def features(enc: Any, split: str, desc: str) -> tuple[torch.Tensor, torch.Tensor]:
        f, y = split_features(cfg, info, enc, split, dev, projector, desc, loader=loaders[split])
        return f, index.to(y.device)[y]  # the class, or its group under --labels

    bank_f, bank_y = features(encoder, bank_split, name)
    query_f, query_y = features(encoder, query_split, name)
    c = len(classes)
    rule_k = rule.k_for(len(bank_f))
    scores = rule.scores(bank_f, bank_y, query_f, c, [k for k in KS if k <= len(bank_f)])
    ks = sorted(scores)
    knn, hits = {}, {}
    for k in ks:
        acc = knn_accuracy(scores[k], query_y.to(scores[k].device), topk=(1, 5))
        knn[k] = {"top1": acc[1], "top5": acc[5]}
        hits[k] = knn_hits(scores[k], query_y, 1).cpu().numpy()
    pr = linear_probe(bank_f, bank_y, query_f, query_y, c, epochs=probe_epochs, device=dev)
    sep = target_noise_separation(bank_f, bank_y, query_f, query_y)
    graph = graph_metrics(query_f, query_y, k=min(10, len(query_f) - 1))
    learned = class_similarity_matrix(query_f, query_y, c).numpy()
    params = {k: getattr(cfg.loss, k) for k in KEY_PARAMS if hasattr(cfg.loss, k)}
    query_labels = query_y.cpu().numpy()
    k_head = _headline(ks)
    grid = nearest_neighbours(bank_f, bank_y, query_f, query_y, pick_queries(query_labels))
    a = cfg.data.augment
    grid = with_images(grid, loaders[query_split], loaders[bank_split], a.mean, a.std)
    base = None
    if baseline and k_head is not None:  # the same loaders, labels, rule, k and probe
        rand = random_init_model(cfg, len(info.classes), sim_t, info.caption_dim).encoder.to(dev)
        rand_bank_f, _ = features(rand, bank_split, f"{name} ({BASELINE})")
        rand_query_f, _ = features(rand, query_split, f"{name} ({BASELINE})")
        base = score_baseline(rand_bank_f, bank_y, rand_query_f, query_y, c, k=k_head,
                              seed=cfg.train.seed,
                              key=_baseline_key(cfg, info, projector, labels),
                              probe_epochs=probe_epochs, device=dev,
                              temperature=rule.temperature)
    return RunEval(
        name=name, run_dir=str(run_dir), loss=cfg.loss.name, params=params,
        epoch=state.epoch, knn=knn,
        probe={"top1": pr.top1, "top5": pr.top5, "weight_decay": pr.weight_decay},
        separation={"margin": sep.margin, "overlap": sep.overlap,
                    "target_median": sep.target_median, "noise_median": sep.noise_median},
        graph=graph, learned_similarity=learned,
        target_similarity=sim if labels is None else None,  # the graph is over classes
        target_sims=sep.target_sims.numpy(), noise_sims=sep.noise_sims.numpy(),
        classes=classes, feature="projector" if projector else "backbone",
        label_set=None if labels is None else str(labels),
        knn_hits=hits, probe_hits=None if pr.hits1 is None else pr.hits1.numpy(),
        query_labels=query_labels, query_split=query_split,
        per_class=[] if k_head is None else per_class_recall(hits[k_head], query_labels,
                                                             classes),
        embedding_map=embedding_map(query_f, query_y), neighbours=grid, baseline=base,
        knn_rule=rule.as_dict(rule_k), knn_top1=float(hits[rule_k].mean()),
    )


def _baseline_key(cfg: PretrainConfig, info: Any, projector: bool,
                  labels: str | Path | None) -> str:
    """What makes two runs' random-init baselines the same row: the same random encoder (model
    section and seed, see components/evaluation/baseline.py), feature, data and labels."""
    from components.config import to_dict

    return json.dumps({"model": to_dict(cfg.model), "seed": cfg.train.seed,
                       "projector": projector, "data": info.manifest.get("params_digest"),
                       "knn": [cfg.knn.temperature, cfg.knn.bank_split],
                       "labels": None if labels is None else str(labels)}, sort_keys=True,
                      default=str)


# ---------------------------------------------------------------------------------------------
# Plots and reports.


def _plt() -> Any:
    from components.evaluation.visuals import pyplot

    return pyplot()


def plot_knn(evals: Sequence[RunEval], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for e in evals:
        ks = sorted(e.knn)
        ax.plot(ks, [100 * e.knn[k]["top1"] for k in ks], marker="o", label=e.name)
    ax.set_xscale("log")
    ax.set_xlabel("k")
    ax.set_ylabel("weighted kNN top-1 (%)")
    ax.set_title("kNN accuracy vs k (X-CLR Fig. 3b)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_separation(evals: Sequence[RunEval], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    bins = np.linspace(-1, 1, 81)
    for i, e in enumerate(evals):
        colour = f"C{i}"
        ax.hist(e.target_sims, bins=bins, histtype="step", color=colour,
                label=f"{e.name} target")
        ax.hist(e.noise_sims, bins=bins, histtype="step", color=colour, linestyle="--",
                label=f"{e.name} noise")
    ax.set_xlabel("cosine similarity to nearest train neighbour")
    ax.set_ylabel("test images")
    ax.set_title("Target vs noise (SINCERE Fig. 2)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_similarity(e: RunEval, path: Path) -> None:
    plt = _plt()
    mats = [("learned (mean pairwise cosine)", e.learned_similarity)]
    if e.target_similarity is not None:
        mats.append(("target (class-caption cosine)", e.target_similarity))
    fig, axes = plt.subplots(1, len(mats), figsize=(4.2 * len(mats), 3.8), squeeze=False)
    for ax, (title, m) in zip(axes[0], mats, strict=True):
        im = ax.imshow(m, vmin=-1, vmax=1, cmap="coolwarm")
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(e.classes)), e.classes, rotation=90, fontsize=6)
        ax.set_yticks(range(len(e.classes)), e.classes, fontsize=6)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(f"{e.name}: class similarity (X-CLR Fig. 4)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _pct(x: float) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def comparison_table(evals: Sequence[RunEval]) -> str:
    """One row per run, then one ``random init`` row per distinct baseline
    (:func:`baseline_rows`: its kNN at the headline k and its probe; no other metric)."""
    ks = sorted({k for e in evals for k in e.knn})
    head = (["run", "loss", "params", "epoch"] + [f"kNN@{k}" for k in ks]
            + ["probe", "margin", "overlap", "label err", "connectivity"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in evals:
        params = ", ".join(f"{k}={v}" for k, v in e.params.items())
        cells = [e.name, e.loss, params, str(e.epoch)]
        cells += [_pct(e.knn[k]["top1"]) if k in e.knn else "—" for k in ks]
        cells += [_pct(e.probe["top1"]), f"{e.separation['margin']:.3f}",
                  _pct(e.separation["overlap"]), _pct(e.graph["label_error"]),
                  f"{e.graph['intra_class_connectivity']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    for name, b in baseline_rows(evals):
        cells = [name, "—", f"seed={b.seed}", "0"]
        cells += [_pct(b.knn_top1) if k == b.k else "—" for k in ks]
        cells += [_pct(b.probe_top1)] + ["—"] * 4
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def baseline_rows(evals: Sequence[RunEval]) -> list[tuple[str, Baseline]]:
    """The random-init rows of a table: one per distinct random encoder scored on the same
    images (``Baseline.key``), named ``random init``, or ``random init (<run>)`` when the
    runs' baselines differ (another model section, seed, feature, data or label set)."""
    seen: dict[str, tuple[str, Baseline]] = {}
    for e in evals:
        if e.baseline is not None and e.baseline.key not in seen:
            seen[e.baseline.key] = (e.name, e.baseline)
    many = len(seen) > 1
    return [(f"{BASELINE} ({run})" if many else BASELINE, b) for run, b in seen.values()]


def headline_k(evals: Sequence[RunEval]) -> int | None:
    """The k the interval tables show: 20 (the parity benches' kNN@20), else the largest k
    every run has below it, else the smallest."""
    common = sorted(set.intersection(*(set(e.knn_hits) for e in evals))) if evals else []
    return _headline(common)


def _headline(ks: Sequence[int]) -> int | None:
    """:func:`headline_k` of one list of k."""
    if not ks:
        return None
    below = [k for k in sorted(ks) if k <= 20]
    return below[-1] if below else min(ks)


def interval_table(evals: Sequence[RunEval]) -> str:
    """kNN, probe and margin with their 95 % intervals, one row per run; with several runs
    scored on the same images, each run's paired difference to the first (``*``: the
    interval excludes 0)."""
    k = headline_k(evals)
    knn_key = f"knn@{k}"
    head = ["run", f"kNN@{k} top-1 %", "probe top-1 %", "margin"]
    diffs = [paired_differences(e, evals[0]) for e in evals[1:]]
    paired = len(evals) > 1
    if paired:
        head += [f"Δ kNN@{k} vs {evals[0].name}", "Δ probe", "Δ margin"]
    bases = baseline_rows(evals)
    if bases:
        head += [f"gain kNN@{k} vs {BASELINE}", f"gain probe vs {BASELINE}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, e in enumerate(evals):
        iv = e.intervals()
        cells = [e.name, fmt(iv.get(knn_key)), fmt(iv.get("probe")),
                 fmt(iv["margin"], scale=1.0, digits=3)]
        if paired:
            d = None if i == 0 else diffs[i - 1]
            if d is None:
                cells += ["—" if i == 0 else "not the same images"] + ["—"] * 2
            else:
                cells += [_diff(d.get(knn_key)), _diff(d.get("probe")),
                          _diff(d["margin"], scale=1.0, digits=3)]
        if bases:
            g = {} if e.baseline is None else e.baseline.gain(e.knn_hits, e.probe_hits)
            cells += [_diff(g.get(knn_key)), _diff(g.get("probe"))]
        lines.append("| " + " | ".join(cells) + " |")
    for name, b in bases:
        iv = b.intervals()
        cells = [name, fmt(iv.get(knn_key)), fmt(iv.get("probe")), "—"]
        cells += ["—"] * (3 if paired else 0) + ["—"] * 2
        lines.append("| " + " | ".join(cells) + " |")
    n = 0 if evals[0].query_labels is None else len(evals[0].query_labels)
    note = (f"95 % percentile bootstrap over the {n} query images ({RESAMPLES} resamples)"
            + ("; differences are paired (the same images), `*` where the interval excludes 0"
               if paired else ""))
    if bases:
        note += (f"; gain: the run minus the {BASELINE} encoder of its config (the weights it "
                 "started from), paired over the same images"
                 + ("" if paired else ", `*` where the interval excludes 0"))
    return "\n".join(lines) + f"\n\n{note}."


def _diff(iv: Interval | None, scale: float = 100.0, digits: int = 1) -> str:
    if iv is None:
        return "—"
    return fmt(iv, scale, digits) + (" *" if iv.excludes_zero() else "")


def eval_dir_name(label_set: str | None) -> str:
    """``eval``, or ``eval-<label map stem>`` for a report against another label set
    (``eval-depth1`` for ``--labels depth:1``)."""
    return "eval" if label_set is None else f"eval-{Path(label_set).stem.replace(':', '')}"


def write_report(e: RunEval) -> str:
    """``<run>/eval/report.md`` with metrics.json and the plots; returns the report path
    (a URI run dir gets them uploaded)."""
    from components.io import storage

    dest = storage.join(e.run_dir, eval_dir_name(e.label_set))
    with storage.LocalMirror(dest) as mirror:
        _write_report(e, mirror.local)
    return storage.join(dest, "report.md")


def per_class_table(e: RunEval, limit: int = PER_CLASS_ROWS) -> str:
    """kNN top-1 recall per class (group under ``--labels``) at the headline k with its 95 %
    interval over that class's query images, worst first; at most ``limit`` rows."""
    k = headline_k([e])
    label = "group" if e.label_set else "class"
    lines = [f"| {label} | {e.query_split} images | kNN@{k} top-1 % [95 % CI] |",
             "|---|---:|---|"]
    lines += [f"| {r.name} | {r.n} | {fmt(r.recall)} |" for r in e.per_class[:limit]]
    more = len(e.per_class) - limit
    return "\n".join(lines) + (f"\n\n{more} more in metrics.json." if more > 0 else "")


def _visual_sections(e: RunEval, out: Path) -> str:
    """Draw the embedding map and the neighbour grid into ``out``; their report sections."""
    from components.evaluation.visuals import plot_map, plot_neighbours, write_map_csv

    text = ""
    bank = e.knn_rule.get("bank_split", "train")  # the kNN's bank: the neighbours' split
    labels = "group" if e.label_set else "class"
    labels_plural = "groups" if e.label_set else "classes"
    if e.embedding_map is not None:
        m = e.embedding_map
        plot_map(m, e.classes, out / "embedding_map.png",
                 f"{e.name}: t-SNE of {len(m)} {e.query_split} images, by {labels}")
        write_map_csv(m, e.classes, out / MAP_CSV)
        pca = f", PCA to {m.pca_dims} dimensions" if m.pca_dims else ""
        drawn = (f"All {m.total} {e.query_split} images" if len(m) == m.total
                 else f"{len(m)} of the {m.total} {e.query_split} images (stratified by "
                      f"{labels}, seed 0)")
        text += f"""
## Embedding map (t-SNE)

![embedding map](embedding_map.png)

{drawn}; {e.feature} features, L2-normalised{pca}; t-SNE (scikit-learn, perplexity
{m.perplexity:.3g}, seed 0), coloured by {labels}. t-SNE keeps neighbourhoods, not the
distances between clusters. Coordinates: `{MAP_CSV}`.
"""
    g = e.neighbours
    if g is not None and len(g.queries) and g.query_images is not None:
        plot_neighbours(g, e.classes, out / "neighbours.png",
                        f"{e.name}: nearest {bank} images ({e.feature} features, cosine)")
        text += f"""
## Nearest neighbours

![nearest neighbours](neighbours.png)

Each row: a {e.query_split} image (spread over the {labels_plural}, seed 0), then its
{g.neighbours.shape[1]} nearest {bank} images by the cosine of the features the kNN uses
(similarity under each {labels} name); a red frame marks a neighbour of another {labels}
({int(g.wrong.sum())} of {g.wrong.size} here).
"""
    return text


def _write_report(e: RunEval, out: Path) -> None:
    plot_knn([e], out / "knn_vs_k.png")
    plot_separation([e], out / "separation.png")
    plot_similarity(e, out / "class_similarity.png")
    write_text(out / "metrics.json", json.dumps(e.summary(), indent=1))
    visuals = _visual_sections(e, out)
    baseline = "" if e.baseline is None else f"""
`{BASELINE}`: the encoder of this run's config at the weights it started from (seed
{e.baseline.seed}, no checkpoint), its features and scores computed the same way (kNN at
k = {e.baseline.k}, probe); the gain is this run minus it, paired over the same images
(`--no-baseline` skips it).
"""
    per_class = "" if not e.per_class else f"""
## Per-{"group" if e.label_set else "class"} kNN recall, worst first

{per_class_table(e)}
"""
    knn_rows = "\n".join(f"| {k} | {_pct(v['top1'])} | {_pct(v['top5'])} |"
                         for k, v in sorted(e.knn.items()))
    labels = (f"the groups of `{e.label_set}` ({', '.join(e.classes)})" if e.label_set
              else "the dataset's classes")
    headline = e.knn_headline()
    headline = f"\n**{headline}** (95 % CI; the rule of the online monitor and of a sweep's " \
               "confirmation: the run's `knn` section)\n" if headline else ""
    tau = e.knn_rule.get("temperature", 0.07)
    bank = e.knn_rule.get("bank_split", "train")
    text = f"""# Evaluation of `{e.name}`

Loss **{e.loss}** ({", ".join(f"{k}={v}" for k, v in e.params.items())}), checkpoint after
epoch {e.epoch}; {e.feature} features of one centre view per image; labels:
{labels}.
{headline}
{comparison_table([e])}

{interval_table([e])}
{baseline}{per_class}{visuals}
## Weighted kNN (Wu et al. 2018; votes exp(cos / {tau:g}), the {bank} bank)

τ = {tau:g} and the bank are the run's `knn.temperature` and `knn.bank_split`, as online.

| k | top-1 % | top-5 % |
|---:|---:|---:|
{knn_rows}

![kNN vs k](knn_vs_k.png)

## Linear probe

Top-1 {_pct(e.probe["top1"])} %, top-5 {_pct(e.probe["top5"])} % (standardised features,
L-BFGS, weight decay {e.probe["weight_decay"]} chosen on a 10 % validation split of train).

## Target–noise separation (SINCERE Table 1, Fig. 2)

Median similarity of each test image to its nearest same-class train image
{e.separation["target_median"]:.3f}, to its nearest other-class train image
{e.separation["noise_median"]:.3f}: margin **{e.separation["margin"]:.3f}**;
{_pct(e.separation["overlap"])} % of test images are at least as close to another class.

![separation](separation.png)

## kNN-graph metrics (X-CLR A.8; our definitions, see components/evaluation/graph.py)

Label error {_pct(e.graph["label_error"])} % (share of symmetric 10-NN edges joining different
classes); intra-class connectivity {e.graph["intra_class_connectivity"]:.3f} (mean share of a
class in its largest connected component; not on the scale of X-CLR's Table 9).

## Class similarity (X-CLR Fig. 4)

![class similarity](class_similarity.png)
"""
    write_text(out / "report.md", text)


def write_comparison(evals: Sequence[RunEval], dest: str) -> str:
    """``comparison.md`` / ``.json`` and overlaid plots in ``dest`` (a path or URI)."""
    from components.io import storage

    with storage.LocalMirror(dest) as mirror:
        _write_comparison(evals, mirror.local)
    return storage.join(dest, "comparison.md")


def _write_comparison(evals: Sequence[RunEval], out: Path) -> None:
    plot_knn(evals, out / "knn_vs_k.png")
    plot_separation(evals, out / "separation.png")
    rules = sorted({e.knn_rule["name"] for e in evals if e.knn_rule.get("name")})
    named = ("" if not rules else "kNN rule (each run's `knn` section; kNN@k: the same votes at "
             "that k): " + "; ".join(f"{e.name}: {e.knn_rule['name']}" for e in evals
                                     if e.knn_rule.get("name"))
             + (" — the runs' rules differ" if len(rules) > 1 else "") + ".\n\n")
    text = (f"# Comparison of {len(evals)} runs\n\n{comparison_table(evals)}\n\n{named}"
            "kNN@k and probe: top-1 %; margin: SINCERE median target − noise similarity; "
            "overlap: % of test images at least as close to another class; label error %: "
            "share of 10-NN edges across classes.\n\n"
            f"## With intervals, against {evals[0].name}\n\n{interval_table(evals)}\n\n"
            "![kNN vs k](knn_vs_k.png)\n\n![separation](separation.png)\n")
    write_text(out / "comparison.md", text)
    summaries = [e.summary() for e in evals]
    for e, summary in zip(evals[1:], summaries[1:], strict=True):
        d = paired_differences(e, evals[0])
        summary["paired_difference_vs"] = evals[0].name
        summary["paired_difference"] = (None if d is None
                                        else {k: iv.as_dict() for k, iv in d.items()})
    write_text(out / "comparison.json", json.dumps(summaries, indent=1))


def main(run_dirs: Sequence[str], checkpoint: str | None = None, projector: bool = False,
         out: str | None = None, labels: str | None = None, baseline: bool = True,
         device: str | None = None) -> int:
    if checkpoint is not None and len(run_dirs) != 1:
        print("simgraph evaluate: --checkpoint needs exactly one RUN_DIR", file=sys.stderr)
        return 2
    from components.io.paths import resolve_path

    run_dirs = [resolve_path(d) for d in run_dirs]  # relative: against $SIMGRAPH_BASE_DIR
    out = resolve_path(out) if out else None
    evals = []

    def each() -> None:
        for d in run_dirs:
            e = evaluate_run(d, checkpoint, projector=projector, labels=labels,
                             baseline=baseline, device=device)
            print(f"{write_report(e)}")
            evals.append(e)

    code = run_command("evaluate", each)
    if code:
        return code
    print(comparison_table(evals))
    print(interval_table(evals))
    if len(evals) > 1:
        from components.io.storage import join, parent

        where = out or join(parent(run_dirs[0]), "comparison")
        print(write_comparison(evals, where))
    return 0

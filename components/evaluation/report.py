"""The evaluation dir a run's report goes to (``<run>/eval/``, ``eval-<map>/`` under
``--labels``: :func:`eval_dir_name`) and what is in it: ``report.md``, ``metrics.json``, the
PNG plots and ``embedding_map.csv`` (:func:`write_report`); the comparison of several runs
(``comparison.md`` / ``.json`` and overlaid plots: :func:`write_comparison`); the tables both
show and ``simgraph evaluate`` prints (:func:`comparison_table`, :func:`interval_table`,
:func:`per_class_table`, :func:`baseline_rows`) and the plots (:func:`plot_knn`,
:func:`plot_separation`, :func:`plot_similarity`). Reads
:class:`~components.evaluation.run_eval.RunEval` only; nothing here loads a run."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from components.evaluation.baseline import BASELINE, Baseline
from components.evaluation.intervals import RESAMPLES, Interval, fmt
from components.evaluation.run_eval import MAP_CSV, RunEval, headline_k, paired_differences
from components.io.files import write_text

PER_CLASS_ROWS = 30  # the report lists the worst classes; metrics.json has every class


# ---------------------------------------------------------------------------------------------
# Plots and reports.


def _plt() -> Any:
    from components.evaluation.visuals import pyplot  # matplotlib, torch: only when drawing

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
    return [(f"{b.name} ({run})" if many else b.name, b) for run, b in seen.values()]


def _base_name(bases: Sequence[tuple[str, Baseline]]) -> str:
    """What the gain columns are against: the rows' common name (``random init``, ``init
    weights``), or ``baseline`` when they differ."""
    names = {b.name for _, b in bases}
    return names.pop() if len(names) == 1 else "baseline"




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
        head += [f"gain kNN@{k} vs {_base_name(bases)}", f"gain probe vs {_base_name(bases)}"]
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
        note += (f"; gain: the run minus the {_base_name(bases)} encoder of its config (the "
                 "weights it "
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
    from components.io import storage  # pyarrow: only when a report is written

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
    from components.evaluation.visuals import (  # matplotlib, torch: only when drawing
        plot_map,
        plot_neighbours,
        write_map_csv,
    )

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
    init = "" if e.baseline is None or e.baseline.name == BASELINE else ", model.init's file"
    baseline = "" if e.baseline is None else f"""
`{e.baseline.name}`: the encoder of this run's config at the weights it started from (seed
{e.baseline.seed}{init}, no checkpoint), its features and scores computed the same way (kNN at
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
    from components.io import storage  # pyarrow: only when a report is written

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

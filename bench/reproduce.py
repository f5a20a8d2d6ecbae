"""Do the papers' orderings reproduce on real data at a CPU budget where the losses converge?

Fashion-MNIST (Debian ``dataset-fashion-mnist``; ``--per-class`` images per class and official
split) or, with ``--data tuxpaint``, Tux Paint stamps (``tuxpaint-stamps-default``: fine labels
are the sub-category folders, coarse ones the top-level categories, X-CLR trains on each
stamp's caption embedding — xclr.txt's per-sample caption graph), the small-data recipe
(``pipelines/configs/pretrain/small_data.yaml``: ConvNet, Adam, constant LR) for ``--epochs``
epochs, every loss with the same model, data, optimiser and budget, ``--seeds`` seeds each,
through ``simgraph pretrain`` and ``simgraph evaluate``'s functions. Per loss (mean ± std over
seeds):

* convergence: the last epoch's loss against its floor (the entropy of the loss's target over
  random batches of the train labels: log |P(i)| for SupCon L_out, the soft-target entropy for
  X-CLR, 0 for the others) and the online kNN's change over the last quarter of the epochs;
* fine labels (Fashion-MNIST's 10 classes; Tux Paint's sub-categories): weighted kNN@20 and
  linear probe top-1 on backbone features;
* coarse labels (tops / bottoms / shoes / bags, ``pipelines/configs/labels/
  fashion_mnist_coarse.yaml``; Tux Paint: ``depth:1``): the same two, without retraining
  (``evaluate --labels``);
* SINCERE's target–noise margin on the normalised projector output (the embedding the loss
  sees, sincere.txt Table 1), and the kNN-graph label error.

Claims, each with a verdict: SupCon > SimCLR (kNN, probe; supcon.txt); X-CLR ≥ SupCon on coarse
structure (xclr.txt); SINCERE margin > SupCon margin (sincere.txt Table 1); CoNe > CE (cone.txt).

    python bench/reproduce.py [--per-class 200] [--epochs 30] [--seeds 0 1 2] [--losses ...]
    python bench/reproduce.py --params best.yaml   # per-loss overrides, e.g. from sweeps
    python bench/reproduce.py --tune 6 --tune-epochs 10   # sweep each loss first

``--params`` is a YAML map ``loss name -> [key=value, ...]`` (e.g. each loss's best setting from
``simgraph sweep``), applied after the defaults below. ``--tune N`` first runs each loss's
``search_spaces/small_data/<loss>.yaml`` sweep (``simgraph sweep``'s own code: Ray Tune +
Optuna TPE, N trials each, the same budget for every loss, scored by the online kNN on the val
split) on the same data, then trains the seeds at each sweep's best setting. A finished sweep
in ``--work`` is read back instead of run again.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.config import PreprocessConfig, PretrainConfig, load_config  # noqa: E402
from components.errors import SimgraphError  # noqa: E402
from components.runs.evaluate import evaluate_run  # noqa: E402
from components.runtime.session import ray_session  # noqa: E402
from components.sweep.driver import run as run_sweep  # noqa: E402
from pipelines import preprocess, pretrain  # noqa: E402

RECIPE = ROOT / "pipelines/configs/pretrain/small_data.yaml"


@dataclasses.dataclass(frozen=True)
class Data:
    """One dataset of the bench: how to build it, how to train on it, its coarse labels."""

    preprocess: str  # a preprocess config, relative to the repo
    build: list[str]  # its overrides ("{per_class}" is filled in)
    train: list[str]  # pretrain overrides for every run on it
    coarse: str  # evaluate --labels: a label map, or depth:N
    xclr_graph: str  # X-CLR's graph: class captions, or each sample's own caption
    about: str  # one sentence for the report ("{per_class}" is filled in)


DATA: dict[str, Data] = {
    "fmnist": Data(
        "pipelines/configs/data/demo.yaml", ["source.max_per_class={per_class}"], [],
        str(ROOT / "pipelines/configs/labels/fashion_mnist_coarse.yaml"), "class",
        "Fashion-MNIST, {per_class} images per class and official split (val = 10 % of "
        "train), 28 px; coarse: tops / bottoms / shoes / bags"),
    # Fine labels: Tux Paint's sub-categories (animals/birds, ~70 classes, many with a handful
    # of stamps); coarse: its 16 top-level categories. X-CLR learns from each stamp's caption.
    "tuxpaint": Data(
        "pipelines/configs/data/tuxpaint.yaml",
        ["source.label_depth=2", "split.val=0.1", "split.test=0.25"],
        ["data.augment.resolution=32", "data.augment.mean=[0.5,0.5,0.5]",
         "data.augment.std=[0.25,0.25,0.25]"],
        "depth:1", "caption",
        "Tux Paint stamps (fine labels: sub-category folders; val 10 %, test 25 %), 64 px "
        "stored, 32 px views; coarse: the 16 top-level categories; X-CLR on per-stamp "
        "caption embeddings"),
}
LOSSES: dict[str, list[str]] = {
    "simclr": ["loss.name=simclr", "loss.tau=0.1"],
    "supcon": ["loss.name=supcon", "loss.tau=0.1"],
    "xclr": ["loss.name=xclr", "loss.tau=0.1", "loss.tau_s=0.1"],  # graph: per dataset
    "sincere": ["loss.name=sincere", "loss.tau=0.1"],
    "eps_supinfonce": ["loss.name=eps_supinfonce", "loss.tau=0.1", "loss.epsilon=0.1"],
    "cone": ["loss.name=cone", "loss.bank_size=1024", "loss.top_n=16"],
    "ce": ["loss.name=ce"],
}
# column -> (header, percent?)
COLUMNS: dict[str, tuple[str, bool]] = {
    "knn20": ("kNN@20", True), "probe": ("probe", True),
    "coarse_knn20": ("coarse kNN@20", True), "coarse_probe": ("coarse probe", True),
    "margin": ("margin (proj.)", False), "label_error": ("label err", True),
}


# ---------------------------------------------------------------------------------------------
# Loss floors: the entropy of each loss's target, over random batches of the train labels.


def loss_floor(cfg: PretrainConfig, labels: np.ndarray, sim: np.ndarray | None,
               batches: int = 20, seed: int = 0) -> float:
    """The loss a perfect embedding would reach, averaged over ``batches`` random global
    batches (2 views each) drawn from ``labels``: cross-entropy ≥ the entropy of its target.

    SupCon L_out: the target is uniform over P(i) (2·n_y − 1 candidates) → log |P(i)|. X-CLR:
    softmax_j(G_ij / τ_s) over the 2B − 1 others → its entropy. SimCLR, SupCon L_in, SINCERE,
    ε-SupInfoNCE, CE, CoNe: one-hot targets or terms that reach 0 → 0.
    """
    loss = cfg.loss
    if loss.name not in ("supcon", "xclr") or getattr(loss, "variant", "out") == "in":
        return 0.0
    rng = np.random.default_rng(seed)
    b = cfg.data.batch_size * cfg.scaling.num_workers
    values = []
    for _ in range(batches):
        y = np.repeat(rng.choice(labels, size=b, replace=False), cfg.data.views)
        if loss.name == "supcon":
            same = (y[:, None] == y[None]).sum(1) - 1  # |P(i)|
            values.append(float(np.log(same).mean()))
            continue
        assert sim is not None
        g = torch.as_tensor(sim[y][:, y], dtype=torch.float64) / loss.tau_s  # type: ignore[union-attr]
        g.fill_diagonal_(-math.inf)
        t = torch.softmax(g, dim=1)
        values.append(float(-(t * torch.log(t.clamp_min(1e-300))).sum(1).mean()))
    return statistics.mean(values)


# ---------------------------------------------------------------------------------------------
# Tuning: each loss's own sweep, the same trial budget for every loss.

SPACES = ROOT / "search_spaces/small_data"


def tune(loss: str, trials: int, epochs: int, dataset: Path, work: Path,
         extra: Sequence[str] = ()) -> list[str]:
    """Run (or read back) ``search_spaces/small_data/<loss>.yaml`` on ``dataset`` with
    ``trials`` trials of ``epochs`` epochs (``extra``: the dataset's pretrain overrides, after
    the space's own); the best trial's parameters as overrides."""
    path = SPACES / f"{loss}.yaml"
    if not path.exists():
        raise SystemExit(f"--tune: no sweep for {loss!r} in {SPACES.relative_to(ROOT)}; "
                         f"there are: {', '.join(sorted(p.stem for p in SPACES.glob('*.yaml')))}")
    own = yaml.safe_load(path.read_text()).get("overrides", [])
    # Each entry quoted: a value such as data.augment.mean=[0.5,0.5,0.5] has brackets of its own.
    trial = [*own, *extra, f"data.dataset={dataset}", f"train.epochs={epochs}"]
    overrides = [f"num_samples={trials}", f"storage={work / 'sweeps'}",
                 "overrides=" + yaml.safe_dump(trial, default_flow_style=True, width=10**6).strip()]
    table = work / "sweeps" / f"small-{loss}" / "trials.csv"
    if table.exists():
        rows = list(csv.DictReader(table.open()))
        params = {k: yaml.safe_load(v) for k, v in rows[0].items()
                  if k.startswith(("loss.", "optim."))}
    else:
        params = run_sweep(str(path), overrides, echo=False)[0]["params"]
    return [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in sorted(params.items())]


# ---------------------------------------------------------------------------------------------
# One run.


def measure(run_dir: Path, coarse_labels: str) -> dict[str, float]:
    fine = evaluate_run(run_dir)
    coarse = evaluate_run(run_dir, labels=coarse_labels)
    proj = evaluate_run(run_dir, projector=True, probe_epochs=1)
    return {"knn20": fine.knn[20]["top1"], "probe": fine.probe["top1"],
            "coarse_knn20": coarse.knn[20]["top1"], "coarse_probe": coarse.probe["top1"],
            "margin": proj.separation["margin"], "label_error": fine.graph["label_error"]}


def convergence(history: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Final loss, and the online kNN's change over the last quarter of the epochs."""
    knn = [(r["epoch"], r["knn_top1"]) for r in history if "knn_top1" in r]
    last = knn[-1][1] if knn else float("nan")
    cut = history[-1]["epoch"] * 3 / 4
    before = [v for e, v in knn if e <= cut]
    return {"final_loss": float(history[-1]["loss"]),
            "knn_last_quarter": last - before[-1] if before else float("nan")}


# ---------------------------------------------------------------------------------------------
# Report.


def _ms(xs: Sequence[float]) -> tuple[float, float]:
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _fmt(xs: Sequence[float], pct: bool) -> str:
    m, s = _ms(xs)
    return f"{100 * m:.1f} ± {100 * s:.1f}" if pct else f"{m:.3f} ± {s:.3f}"


def verdict(a: Sequence[float], b: Sequence[float], at_least: bool = False) -> str:
    """'holds' when mean(a) > mean(b) (≥ with ``at_least``) by more than two standard errors
    of the difference, 'holds within noise' when only the means order that way, else 'does
    not hold' (or 'the opposite holds' beyond two standard errors)."""
    if min(len(a), len(b)) < 2:
        return "no verdict (one seed: no spread to compare against)"
    (ma, sa), (mb, sb) = _ms(a), _ms(b)
    se = math.sqrt(sa**2 / len(a) + sb**2 / len(b))
    diff = ma - mb
    if diff > 2 * se:
        return "holds"
    if diff > 0 or (at_least and diff == 0):
        return "holds within noise"
    if at_least and diff > -2 * se:
        return "holds within noise (≥: the difference is under two standard errors)"
    return "the opposite holds" if diff < -2 * se else "does not hold (within noise)"


CLAIMS = [  # text, a, b, metric, at_least
    ("SupCon > SimCLR (kNN@20)", "supcon", "simclr", "knn20", False),
    ("SupCon > SimCLR (probe)", "supcon", "simclr", "probe", False),
    ("X-CLR ≥ SupCon on coarse structure (coarse kNN@20)", "xclr", "supcon", "coarse_knn20", True),
    ("X-CLR ≥ SupCon on coarse structure (coarse probe)", "xclr", "supcon", "coarse_probe", True),
    ("SINCERE margin > SupCon margin (projector)", "sincere", "supcon", "margin", False),
    ("CoNe > CE (kNN@20)", "cone", "ce", "knn20", False),
    ("CoNe > CE (probe)", "cone", "ce", "probe", False),
]


def report(results: dict[str, list[dict[str, float]]], floors: dict[str, float],
           args: argparse.Namespace, wall: float, failed: list[str],
           tuned: dict[str, list[str]]) -> str:
    head = ("| loss | final loss | floor | kNN Δ last ¼ | "
            + " | ".join(h for h, _ in COLUMNS.values()) + " |")
    rows = [head, "|---|" + "---:|" * (3 + len(COLUMNS))]
    for loss, runs in results.items():
        cells = [_fmt([r["final_loss"] for r in runs], False), f"{floors[loss]:.3f}",
                 _fmt([r["knn_last_quarter"] for r in runs], True)]
        cells += [_fmt([r[c] for r in runs], pct) for c, (_, pct) in COLUMNS.items()]
        rows.append(f"| {loss} | " + " | ".join(cells) + " |")
    claims = []
    for text, a, b, m, at_least in CLAIMS:
        if a not in results or b not in results:
            claims.append(f"- {text}: not run")
            continue
        xa, xb = [r[m] for r in results[a]], [r[m] for r in results[b]]
        scale = 100 if COLUMNS[m][1] else 1
        claims.append(f"- {text}: **{verdict(xa, xb, at_least)}** ({_fmt(xa, scale == 100)} "
                      f"vs {_fmt(xb, scale == 100)})")
    how = ("each loss at its sweep's best setting (`search_spaces/small_data/<loss>.yaml`, "
           f"{args.tune} trials of {args.tune_epochs} epochs)" if args.tune else "settings")
    graph = {"xclr": [f"loss.graph={DATA[args.data].xclr_graph}"]}
    settings = [
        f"- {loss}: `{' '.join([*LOSSES[loss], *graph.get(loss, []), *tuned.get(loss, [])])}`"
        for loss in results]
    cmd = "python bench/reproduce.py " + " ".join(sys.argv[1:])
    about = DATA[args.data].about.format(per_class=args.per_class)
    return f"""`{cmd}` — {datetime.date.today()}, {platform.machine()} CPU, {wall / 60:.0f} min.
{about}; `{RECIPE.relative_to(ROOT)}` for {args.epochs} epochs, the same for every loss;
mean ± std over {len(args.seeds)} seeds. kNN@20 / probe: top-1 % on the test split, backbone
features; coarse: the same against the coarse groups; margin: SINCERE median target − noise
cosine on the projector output; label err: % of test 10-NN edges across classes. Floor: the entropy
of the loss's target (0 where the target is one-hot); kNN Δ last ¼: online kNN (val) change
over the last quarter of the epochs (near 0: flattened).

{chr(10).join(rows)}

Per loss, {how}:

{chr(10).join(settings)}

Claims (verdict: "holds" = by more than two standard errors):

{chr(10).join(claims)}

{"Failed runs: " + "; ".join(failed) if failed else "Every run finished."}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="fmnist", choices=list(DATA))
    ap.add_argument("--per-class", type=int, default=200, help="fmnist: images per class")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--losses", nargs="+", default=list(LOSSES), choices=list(LOSSES))
    ap.add_argument("--params", help="YAML: loss name -> list of overrides (e.g. sweep bests)")
    ap.add_argument("--tune", type=int, default=0, metavar="N",
                    help="sweep each loss first (N trials each) and train at its best setting")
    ap.add_argument("--tune-epochs", type=int, default=10)
    ap.add_argument("--work", default="runs/reproduce")
    ap.add_argument("--out", default=None, help="also write the report to this file")
    ap.add_argument("overrides", nargs="*", help="extra pretrain overrides for every run")
    args = ap.parse_args()
    tuned: dict[str, list[str]] = {}
    if args.params:
        tuned = yaml.safe_load(Path(args.params).read_text()) or {}
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    # One line per run measured, keyed by its whole config: re-running the same command after
    # an interruption trains only what is missing.
    log_path = work / "reproduce.jsonl"
    done = {}
    if log_path.exists():
        done = {r["config"]: r["row"] for r in map(json.loads, log_path.read_text().splitlines())}
    data = DATA[args.data]
    pre = load_config(ROOT / data.preprocess, PreprocessConfig, [
        f"output={work / 'data'}", *[o.format(per_class=args.per_class) for o in data.build]])
    results: dict[str, list[dict[str, float]]] = {}
    floors: dict[str, float] = {}
    failed: list[str] = []
    t0 = time.perf_counter()
    with ray_session(None):
        preprocess.run(pre, echo=False)
        from components.data.reader import DatasetInfo
        from components.data.shards import read_samples

        info = DatasetInfo.load(pre.output)
        rows = read_samples(info.split_file("train"))
        labels = np.array([r["label"] for r in rows])
        sim = info.class_similarity()
        for loss in args.losses:
            own = [*data.train, *([f"loss.graph={data.xclr_graph}"] if loss == "xclr" else [])]
            if loss == "xclr" and data.xclr_graph == "caption":
                # The target over samples: each sample its own "class", the caption cosines.
                caps = np.stack([r["caption"] for r in rows]).astype(np.float64)
                floor_labels, floor_sim = np.arange(len(rows)), caps @ caps.T
            else:
                floor_labels, floor_sim = labels, sim
            if args.tune:
                tuned[loss] = tune(loss, args.tune, args.tune_epochs, pre.output, work, own)
                print(f"[reproduce] {loss} tuned: {' '.join(tuned[loss])}", flush=True)
            for seed in args.seeds:
                cfg = load_config(RECIPE, PretrainConfig, [
                    *LOSSES[loss], *own, *tuned.get(loss, []), f"name={loss}-s{seed}",
                    f"storage={work / 'runs'}", f"data.dataset={pre.output}",
                    f"train.seed={seed}", f"train.epochs={args.epochs}", "knn.every_epochs=1",
                    "checkpoint.every_epochs=10", *args.overrides])
                floors[loss] = loss_floor(cfg, floor_labels, floor_sim)
                key = json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str)
                if key in done:
                    results.setdefault(loss, []).append(done[key])
                    continue
                try:
                    history = pretrain.run(cfg, echo=False)
                except SimgraphError as err:  # reported; the others still run
                    print(f"{cfg.name}: FAILED {err}", flush=True)
                    failed.append(f"{cfg.name}: {str(err).splitlines()[0]}")
                    continue
                row = {**convergence(history), **measure(work / "runs" / cfg.name, data.coarse)}
                results.setdefault(loss, []).append(row)
                with log_path.open("a") as f:
                    f.write(json.dumps({"config": key, "row": row}) + "\n")
                print(f"[reproduce] {cfg.name}: " + ", ".join(f"{k} {v:.4g}"
                                                              for k, v in row.items()),
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
    text = report(results, floors, args, time.perf_counter() - t0, failed, tuned)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()

"""Sweep efficiency: do TPE with ASHA, TPE alone and random search find what a full grid finds,
and at what share of its epochs? (issue 30: "a measured edge over grids")

One two-parameter space — X-CLR on the class-caption graph, τ × τ_s, 5 × 5 values — on a
Fashion-MNIST subset with the small-data recipe (ConvNet, Adam), every trial the same number
of epochs with the online kNN on the val split each epoch:

1. **The grid**: a real ``simgraph sweep`` with ``searcher: {name: grid}`` (every point once,
   FIFO). It records each setting's per-epoch kNN top-1.
2. **Each searcher × searcher seed**: Ray Tune with the sweep's own searcher and scheduler
   (``components.sweep.tuner.make_searcher`` / ``make_scheduler``: Optuna over the same choices,
   ASHA on the trial score) where each trial *replays* the grid's recorded run of its setting
   epoch by epoch. Every trial of a sweep trains with the same ``train.seed``, and a CPU run
   of a setting is deterministic, so a real sweep's trial at that setting is that run
   (``--check-replay`` trains one real TPE + ASHA sweep and compares its trial scores with
   the replay's). The searcher's answer is the product's: the best row of
   ``components.sweep.results.trial_rows``. Epochs spent = the epochs its trials reported.
3. **Confirmation** (the product's stage, ``components/sweep/confirmation.py``): every setting a
   searcher chose, plus the grid's top ``--grid-top``, retrained with ``--confirm-seeds``
   fresh seeds and scored by kNN top-1 on the test split (never used for choosing), with 95 %
   bootstrap intervals over the test images.

Goal (issue 30): TPE + ASHA within 1 kNN point of the grid's confirmed best at ≤ 25 % of the
grid's epochs. Printed: per searcher, over searcher seeds, the confirmed test score of its
choice minus the grid's (mean, min, how often within 1 point) and its epochs as a share of the
grid's; then every confirmed setting with its interval and Spearman's ρ between sweep scores
and confirmed scores. Everything is kept in ``--work``: a re-run resumes (the grid sweep and
the confirmation runs pick up where they stopped; replays are re-done, they take seconds).

    python bench/sweep_efficiency.py [--per-class 150] [--epochs 6] [--searcher-seeds 0 1 2 3 4]

Run it inside a loopback-only network namespace like the tests (``make bench-sweep-efficiency``
does), never beside ``make test`` (its cluster tests stop every Ray on the machine).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.config import PreprocessConfig, load_config  # noqa: E402
from components.search_space import SCORE, load_sweep, score_history, score_spec  # noqa: E402
from components.sweep.confirm_runs import confirm  # noqa: E402
from components.sweep.driver import run as run_sweep  # noqa: E402
from components.sweep.results import trial_rows  # noqa: E402
from components.sweep.tuner import make_scheduler, make_searcher  # noqa: E402
from pipelines import preprocess  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "pipelines/configs/pretrain/small_data.yaml"
TAU = [0.05, 0.1, 0.2, 0.3, 0.5]
TAU_S = [0.02, 0.05, 0.1, 0.3, 1.0]
GRID = {"loss.tau": TAU, "loss.tau_s": TAU_S}  # --tau / --tau-s replace them
PARAMS = ("loss.tau", "loss.tau_s")


def key(params: Mapping[str, Any]) -> tuple[float, float]:
    return (float(params["loss.tau"]), float(params["loss.tau_s"]))


def sweep_file(work: Path, dataset: str, epochs: int) -> Path:
    """The grid sweep; the searchers replay it with overrides of its searcher / scheduler /
    num_samples (``load_sweep``'s command-line overrides)."""
    spec = {
        "name": "grid", "storage": str(work / "sweeps"), "base": str(RECIPE),
        "overrides": ["loss.name=xclr", "loss.graph=class", f"data.dataset={dataset}",
                      f"train.epochs={epochs}", "knn.every_epochs=1",
                      f"checkpoint.every_epochs={epochs}"],
        "metric": "knn_top1", "mode": "max",
        "num_samples": len(GRID["loss.tau"]) * len(GRID["loss.tau_s"]),
        "max_concurrent": "auto",
        "resources": {"workers": 1, "cpus_per_worker": 1.0},
        "searcher": {"name": "grid", "seed": 0}, "scheduler": {"name": "fifo"},
        "statistic": {"name": "mean_last", "k": 3},
        "space": {p: {"choice": v} for p, v in GRID.items()},
    }
    path = work / "grid.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_grid(path: Path) -> list[dict[str, Any]]:
    """The grid sweep's trial rows (resumed when its dir exists)."""
    sweep = load_sweep(path)
    resume = (Path(sweep.storage) / sweep.name).exists()
    return run_sweep(str(path), [], resume=resume, echo=False, trust=True)


def replay_fn(config: dict[str, Any], curves: dict[str, list[list[float]]],
              spec: dict[str, Any]) -> None:
    """A Tune trial that reports the grid's recorded run of its setting, epoch by epoch, as
    ``components.sweep.tuner.trial_fn`` reports a real run (metric, epoch, trial score)."""
    from ray import tune

    curve = curves[json.dumps(key(config))]
    history = [{"epoch": int(e), spec["metric"]: v} for e, v in curve]
    for row, score in zip(history, score_history(history, spec), strict=True):
        tune.report({**row, **({} if score is None else {SCORE: score})})


def replay(path: Path, overrides: Sequence[str], curves: dict[str, list[list[float]]],
           storage: Path) -> tuple[list[dict[str, Any]], int]:
    """One searcher run over the grid's recorded runs: (the product's trial rows, best first;
    epochs its trials reported)."""
    import ray.tune

    sweep = load_sweep(path, list(overrides))
    tuner = ray.tune.Tuner(
        ray.tune.with_parameters(replay_fn, curves=curves, spec=score_spec(sweep)),
        tune_config=ray.tune.TuneConfig(search_alg=make_searcher(sweep),
                                        scheduler=make_scheduler(sweep),
                                        num_samples=sweep.num_samples),
        run_config=ray.tune.RunConfig(name="_".join(o.replace("=", "-") for o in overrides),
                                      storage_path=str(storage), verbose=0),
    )
    results = tuner.fit()
    rows = trial_rows(results, sweep)
    return rows, sum(int(r["epochs"]) for r in rows)


def check_replay(path: Path, overrides: Sequence[str], curves: dict[str, list[list[float]]],
                 storage: Path) -> str:
    """Train one real sweep with ``overrides`` and compare each trial's score with the grid's
    recorded run of its setting (the replay's assumption)."""
    real = run_sweep(str(path), [*overrides, "name=replay-check"], echo=False,
                     resume=(Path(load_sweep(path).storage) / "replay-check").exists(),
                     trust=True)
    sweep = load_sweep(path, list(overrides))
    spec = score_spec(sweep)
    worst = 0.0
    for r in real:
        curve = curves[json.dumps(key(r["params"]))][: int(r["epochs"])]
        history = [{"epoch": int(e), spec["metric"]: v} for e, v in curve]
        recorded = score_history(history, spec)[-1]
        worst = max(worst, abs(float(r["score"]) - float(recorded)))
    return (f"replay check ({' '.join(overrides)}): {len(real)} real trials, largest |real "
            f"score - replayed score| = {worst:.2e}")


SEARCHERS: dict[str, list[str]] = {
    # trials: num_samples; TPE models after 3 random trials in every variant
    "tpe+asha": ["searcher.name=tpe", "scheduler.name=asha", "scheduler.grace_period=1",
                 "scheduler.reduction_factor=3", "searcher.startup_trials=3"],
    "tpe": ["searcher.name=tpe", "scheduler.name=fifo", "searcher.startup_trials=3"],
    "random": ["searcher.name=random", "scheduler.name=fifo"],
}


def main() -> None:
    from components.runtime.session import ray_session

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-class", type=int, default=150, help="Fashion-MNIST images per class")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--searcher-seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--budget", type=float, default=0.25,
                    help="TPE / random trials: this share of the grid's points")
    ap.add_argument("--asha-trials", type=int, default=12)
    ap.add_argument("--grid-top", type=int, default=3)
    ap.add_argument("--confirm-seeds", type=int, default=3)
    ap.add_argument("--tau", type=float, nargs="+", default=TAU)
    ap.add_argument("--tau-s", type=float, nargs="+", default=TAU_S)
    ap.add_argument("--check-replay", action="store_true")
    ap.add_argument("--work", default="runs/sweep_efficiency")
    ap.add_argument("--out", default=None, help="also write the report to this file")
    args = ap.parse_args()
    GRID.update({"loss.tau": args.tau, "loss.tau_s": args.tau_s})
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    pre = load_config(ROOT / "pipelines/configs/data/demo.yaml", PreprocessConfig, [
        f"output={work / 'data'}", f"source.max_per_class={args.per_class}"])
    with ray_session(None):
        preprocess.run(pre, echo=False)
    path = sweep_file(work, pre.output, args.epochs)
    grid_rows = run_grid(path)
    t_grid = time.perf_counter() - t0
    finished = [r for r in grid_rows if r["status"] == "finished"]
    points = len(args.tau) * len(args.tau_s)
    if len(finished) != points:
        sys.exit(f"the grid has {len(finished)} finished trials of {points}")
    curves = {json.dumps(key(r["params"])): [list(p) for p in r["curve"]] for r in finished}
    grid_epochs = sum(int(r["epochs"]) for r in finished)
    grid_score = {key(r["params"]): float(r["score"]) for r in finished}
    n_plain = max(1, math.floor(args.budget * len(finished)))
    trials = {"tpe+asha": args.asha_trials, "tpe": n_plain, "random": n_plain}
    chosen: dict[str, list[tuple[tuple[float, float], int]]] = {s: [] for s in SEARCHERS}
    notes: list[str] = []
    with ray_session(None):
        for name, over in SEARCHERS.items():
            for seed in args.searcher_seeds:
                overrides = [*over, f"searcher.seed={seed}", f"num_samples={trials[name]}"]
                rows, epochs = replay(path, overrides, curves, work / "replays")
                chosen[name].append((key(rows[0]["params"]), epochs))
        if args.check_replay:
            notes.append(check_replay(path, [*SEARCHERS["tpe+asha"], "searcher.seed=0",
                                             f"num_samples={trials['tpe+asha']}"],
                                      curves, work / "replays"))
    # Confirm the grid's top settings and every searcher's choice, best sweep score first.
    by_score = sorted(grid_score, key=lambda k: -grid_score[k])
    confirm_keys = list(dict.fromkeys(
        [*by_score[: args.grid_top], *sorted({k for v in chosen.values() for k, _ in v},
                                             key=lambda k: -grid_score[k])]))
    confirm_keys.sort(key=lambda k: -grid_score[k])
    # The grid's own trial rows, the settings to confirm first: the confirmation stage takes
    # the first `confirm.top` settings of the rows it is given (and writes them all out).
    first = {k: i for i, k in enumerate(confirm_keys)}
    rows = sorted(finished, key=lambda r: first.get(key(r["params"]), len(first)))
    confirm_over = [f"confirm.top={len(confirm_keys)}", f"confirm.seeds={args.confirm_seeds}",
                    "confirm.split=test"]
    conf = confirm(load_sweep(path, confirm_over), rows, str(path), confirm_over, echo=False)
    confirmed = {key(c.candidate.params): c for c in conf.settings}
    grid_choice = by_score[0]
    grid_test = confirmed[grid_choice].score.value
    best_test = conf.best.score.value
    wall = time.perf_counter() - t0
    report = render(args, chosen, confirmed, conf, grid_choice, grid_test, best_test,
                    grid_epochs, trials, len(finished), notes, t_grid, wall)
    print(report)
    if args.out:
        Path(args.out).write_text(report)


def render(args: Any, chosen: Mapping[str, list[tuple[tuple[float, float], int]]],
           confirmed: Mapping[tuple[float, float], Any], conf: Any,
           grid_choice: tuple[float, float], grid_test: float, best_test: float,
           grid_epochs: int, trials: Mapping[str, int], points: int, notes: Sequence[str],
           t_grid: float, wall: float) -> str:
    def pct(x: float) -> str:
        return f"{100 * x:.1f}"

    lines = [
        f"## Sweep efficiency ({datetime.date.today()}, {platform.machine()}, "
        f"{platform.python_version()})",
        "",
        f"X-CLR (class graph), τ ∈ {args.tau} × τ_s ∈ {args.tau_s}; Fashion-MNIST "
        f"{args.per_class}/class, small-data recipe, {args.epochs} epochs, trial score = mean "
        f"of the last 3 val kNN top-1; searcher seeds {args.searcher_seeds}; confirmation: "
        f"{args.confirm_seeds} fresh seeds, kNN top-1 on the {conf.images}-image test split.",
        f"Grid: {points} trials, {grid_epochs} epochs ({t_grid / 60:.1f} min); its choice "
        f"τ={grid_choice[0]}, τ_s={grid_choice[1]} confirms at {pct(grid_test)} % (best "
        f"confirmed setting {pct(best_test)} %).",
        "",
        "| searcher | trials | epochs (share of grid) | choice − grid's, test kNN points: mean "
        "[min, max] | within 1 point | tied with the confirmed best |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, runs in chosen.items():
        diffs = [100 * (confirmed[k].score.value - grid_test) for k, _ in runs]
        epochs = [e for _, e in runs]
        share = statistics.mean(epochs) / grid_epochs
        within = sum(d >= -1.0 for d in diffs)
        tied = sum(confirmed[k].tied for k, _ in runs)
        lines.append(f"| {name} | {trials[name]} | {statistics.mean(epochs):.1f} "
                     f"({pct(share)} %) | {statistics.mean(diffs):+.2f} [{min(diffs):+.2f}, "
                     f"{max(diffs):+.2f}] | {within}/{len(runs)} | {tied}/{len(runs)} |")
    lines += ["", "Confirmed settings (best first; interval: 95 % bootstrap over the test "
              "images of the seed-averaged hits; tied: the paired difference to the best holds "
              "0):", "", "| τ | τ_s | sweep score (val) | test kNN top-1 % [95 %] | seeds | "
              "tied | chosen by |", "|---:|---:|---:|---:|---|---|---|"]
    for k, c in confirmed.items():
        by = [f"{n}×{sum(1 for kk, _ in runs if kk == k)}" for n, runs in chosen.items()
              if any(kk == k for kk, _ in runs)]
        if k == grid_choice:
            by.insert(0, "grid")
        iv = c.score
        lines.append(f"| {k[0]} | {k[1]} | {pct(c.candidate.sweep_score)} | {pct(iv.value)} "
                     f"[{pct(iv.low)}, {pct(iv.high)}] | "
                     f"{', '.join(pct(s) for s in c.seed_scores)} | {'yes' if c.tied else 'no'} "
                     f"| {', '.join(by) or '—'} |")
    rho = "n/a" if conf.spearman is None else f"{conf.spearman:.2f}"
    lines += ["", f"Spearman's ρ (sweep score vs confirmed test score, confirmed settings): "
              f"{rho}.", *notes, f"Wall time {wall / 60:.1f} min."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

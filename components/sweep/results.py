"""A finished sweep's results: one row per Tune trial (:func:`trial_rows`, best setting
first; :func:`best_row`), the trials table (:func:`markdown`) and what the sweep dir gets
(:func:`write_results`): ``trials.csv`` / ``trials.md``, ``trials.json`` (the rows
``--confirm`` reads back), ``best.yaml`` (a runnable pretrain config), plots and importances,
and the Optuna study in ``study_storage`` when configured."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from components.config import to_dict
from components.errors import describe
from components.io.files import atomic_open, write_text
from components.sweep.layout import TRIALS_JSON, sweep_dir
from components.sweep.study import export_study, plot_results

if TYPE_CHECKING:
    from components.search_space import SweepConfig


def trial_rows(results: Any, sweep: SweepConfig) -> list[dict[str, Any]]:
    """One row per trial: id, status, parameters (its setting), repeat index, epochs run,
    last and best metric, score, and its setting's ``setting_mean`` / ``setting_sd`` /
    ``setting_n`` over the setting's finished repeats (``repeats``). Sorted best setting
    first (then best trial); a failed trial carries its error and no metric values."""
    from components.search_space import REPEAT_INDEX, setting_of  # YAML + configs: ~0.1 s

    rows: list[dict[str, Any]] = []
    for r in results:
        cfg = setting_of(r.config or {})
        repeat = int((r.config or {}).get(REPEAT_INDEX, 0) or 0)
        trial = (r.metrics or {}).get("trial_id") or Path(r.path).name
        df = _whole_history(sweep, str(trial), r.metrics_dataframe)
        history = [] if df is None or sweep.metric not in df else list(df[sweep.metric])
        epochs = int(df["epoch"].max()) if df is not None and "epoch" in df else 0
        failed = r.error is not None
        best = score = None
        if history and not failed:
            finite = [v for v in history if isinstance(v, int | float) and math.isfinite(v)]
            if finite:
                best = max(finite) if sweep.mode == "max" else min(finite)
            score = sweep.statistic.score(history, sweep.mode)
        curve = ([(int(e), float(v)) for e, v in zip(df["epoch"], df[sweep.metric], strict=True)
                  if isinstance(v, int | float) and math.isfinite(v)]
                 if history and "epoch" in df else [])
        rows.append({
            "trial": trial,
            "status": "failed" if failed else "finished",
            "error": _short(r.error) if failed else "",
            "epochs": epochs,
            sweep.metric: None if failed or not history else history[-1],
            f"best_{sweep.metric}": best,
            "score": score,  # sweep.statistic of the metric's evaluations: what ranks trials
            "params": cfg,
            "repeat": repeat,
            "curve": curve,  # (epoch, metric) as reported: the learning-curves plot
        })
    by_setting: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_setting.setdefault(repr(sorted(row["params"].items())), []).append(row)
    for members in by_setting.values():
        scores = [m["score"] for m in members if m["score"] is not None]
        mean = sum(scores) / len(scores) if scores else None
        sd = (math.sqrt(sum((x - mean) ** 2 for x in scores) / (len(scores) - 1))
              if mean is not None and len(scores) > 1 else None)
        for m in members:
            m.update(setting_mean=mean, setting_sd=sd, setting_n=len(scores))
    sign = -1.0 if sweep.mode == "max" else 1.0

    def order(row: dict[str, Any]) -> tuple[bool, float, bool, float, str]:
        # ties by trial id: the same ranking whatever order Tune hands the results in (a
        # --resume re-ranked tied trials and replaced a confirmed best.yaml)
        mean, score = row["setting_mean"], row["score"]
        return (mean is None, sign * float(mean or 0.0), score is None,
                sign * float(score or 0.0), str(row["trial"]))

    rows.sort(key=order)
    return rows


def _whole_history(sweep: SweepConfig, trial: str, df: Any) -> Any:
    """The trial's per-epoch results: Tune's, or — when the trial's run dir
    (``<sweep dir>/trials/<trial id>``, local) records more epochs, as after a ``--resume`` of
    a killed driver, where Tune's restored trial holds only the results reported since — its
    ``metrics.csv``, the run's whole history. A score from the results since a resume alone
    ranked a trial by its last epochs only."""
    from components.io import storage
    from components.runs.run_log import read_history
    from components.sweep.layout import trials_dir

    root = trials_dir(sweep)
    if storage.is_uri(root):
        return df
    rows = read_history(storage.join(root, trial))
    seen = 0 if df is None or "epoch" not in df else len(df)
    if rows is None or len(rows) <= seen or any("epoch" not in r for r in rows):
        return df
    import pandas as pd

    return pd.DataFrame(rows)


def best_row(rows: Sequence[dict[str, Any]], sweep: SweepConfig) -> dict[str, Any] | None:
    """The best trial of :func:`trial_rows` (of the best setting: sorted best first, failed
    ones last), or None."""
    return rows[0] if rows and rows[0]["score"] is not None else None


def setting_score(row: dict[str, Any]) -> str:
    """``mean ± sd (n)`` of a row's setting, or the trial's score alone."""
    mean, sd, n = row["setting_mean"], row["setting_sd"], row["setting_n"]
    if mean is None:
        return "—"
    return f"{mean:.4g}" + (f" ± {sd:.2g} (n={n})" if n > 1 and sd is not None else "")


def _short(err: Any) -> str:
    return describe(err)[:300] if isinstance(err, BaseException) else str(err)[:300]


def markdown(rows: Sequence[dict[str, Any]], sweep: SweepConfig) -> str:
    from components.sweep.confirmation import format_value  # numpy

    keys = sorted({k for r in rows for k in r["params"]})
    repeats = sweep.repeats > 1
    head = ["trial", "status", "epochs", f"score: {sweep.statistic.describe(sweep.metric)}",
            *(["setting: mean ± sd (n)", "seed +"] if repeats else []),
            f"best {sweep.metric}", *keys]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        best, score = r[f"best_{sweep.metric}"], r["score"]
        cells = [r["trial"], r["status"] + (f" ({r['error']})" if r["error"] else ""),
                 str(r["epochs"]), "—" if score is None else f"{score:.4g}",
                 *([setting_score(r), str(r["repeat"])] if repeats else []),
                 "—" if best is None else f"{best:.4g}"]
        cells += [format_value(r["params"].get(k)) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_results(sweep: SweepConfig, rows: Sequence[dict[str, Any]]) -> None:
    """trials.csv / .md, best.yaml, plots, importances into the sweep dir (published to a URI
    sweep dir when the files are complete)."""
    from components.io.storage import LocalMirror  # pyarrow

    with LocalMirror(sweep_dir(sweep)) as mirror:
        _write_results(sweep, rows, mirror.local)
    if sweep.study_storage:
        export_study(sweep, rows)


def _write_results(sweep: SweepConfig, rows: Sequence[dict[str, Any]], out: Path) -> None:
    from components.io.storage import redacted  # pyarrow
    from components.search_space import trial_config  # YAML + configs: ~0.1 s

    keys = sorted({k for r in rows for k in r["params"]})
    with atomic_open(out / "trials.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trial", "status", "error", "epochs", "score", "repeat", "setting_mean",
                    "setting_sd", "setting_n", sweep.metric, f"best_{sweep.metric}", *keys])
        for r in rows:
            w.writerow([r["trial"], r["status"], r["error"], r["epochs"], r["score"],
                        r["repeat"], r["setting_mean"], r["setting_sd"], r["setting_n"],
                        r[sweep.metric], r[f"best_{sweep.metric}"],
                        *[r["params"].get(k) for k in keys]])
    write_text(out / "trials.md", markdown(rows, sweep) + "\n")
    write_text(out / TRIALS_JSON, json.dumps(list(rows), indent=1, default=str) + "\n")
    best = best_row(rows, sweep)
    if best is not None:
        cfg = trial_config(sweep, best["params"], name=f"{sweep.name}-best",
                           storage=sweep.storage)
        write_text(
            out / "best.yaml",
            f"# best {'setting' if sweep.repeats > 1 else 'trial'} of sweep {sweep.name} "
            f"(trial {best['trial']}): {sweep.statistic.describe(sweep.metric)} = "
            f"{setting_score(best)}\n"
            + yaml.safe_dump(redacted(to_dict(cfg)), sort_keys=False)
        )
    plot_results(sweep, rows, out)

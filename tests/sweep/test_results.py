"""A sweep's ranking of its trials (``components.sweep.results.trial_rows``) as a ``--resume``
sees them: a trial resumed after the driver was killed is scored on its whole history (its run
dir's ``metrics.csv``; Tune's restored trial holds only the results reported since), and tied
trials rank the same whatever order Tune hands them in (no Ray)."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from components.search_space import load_sweep
from components.sweep.results import best_row, trial_rows
from tests.e2e.test_sweep import _df, _space


def _result(trial: str, df: Any, lr: float = 0.1) -> SimpleNamespace:
    return SimpleNamespace(config={"loss.name": "simclr", "optim.lr": lr}, error=None,
                           metrics={"trial_id": trial}, path=f"x/{trial}",
                           metrics_dataframe=df)


def test_a_resumed_trial_is_scored_on_its_whole_history(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pandas as pd

    monkeypatch.chdir(tmp_path)
    sweep = load_sweep(_space(tmp_path))
    run_dir = tmp_path / "sweeps" / "s" / "trials" / "a"
    run_dir.mkdir(parents=True)
    with open(run_dir / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["epoch", "loss", "knn_top1"])
        w.writeheader()
        for e, v in enumerate([0.5, 0.6, 0.7, 0.9], start=1):
            w.writerow({"epoch": e, "loss": 2.0 / e, "knn_top1": v})
    # Tune's restored trial "a" holds only epoch 4's result (0.9): its score would be 0.9
    since_resume = pd.DataFrame({"knn_top1": [0.9], "epoch": [4]})
    rows = trial_rows([_result("a", since_resume), _result("b", _df([0.7, 0.72, 0.74, 0.76]),
                                                           lr=0.2)], sweep)
    assert [r["trial"] for r in rows] == ["b", "a"]  # a: mean(0.6, 0.7, 0.9) < b: 0.74
    a = rows[1]
    assert a["score"] == pytest.approx((0.6 + 0.7 + 0.9) / 3) and a["epochs"] == 4
    assert a["curve"] == [(1, 0.5), (2, 0.6), (3, 0.7), (4, 0.9)]
    assert a["best_knn_top1"] == 0.9


def test_tied_trials_rank_the_same_in_any_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    sweep = load_sweep(_space(tmp_path))
    x, y = _result("t_00001", _df([0.5, 0.9]), lr=0.1), _result("t_00000", _df([0.9, 0.5]),
                                                                  lr=0.2)
    first = trial_rows([x, y], sweep)
    again = trial_rows([y, x], sweep)  # a --resume: Tune's results in another order
    assert [r["trial"] for r in first] == [r["trial"] for r in again] == ["t_00000", "t_00001"]
    best = best_row(first, sweep)
    assert best is not None and best["trial"] == "t_00000"

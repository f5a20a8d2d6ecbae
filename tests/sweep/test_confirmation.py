"""The confirmation stage (components/sweep/confirmation.py): which settings are retrained, and
the confirmed answer from per-image hits — the best by its seed-averaged score with a
bootstrap interval, paired differences to it (a setting against itself: exactly 0, so
tied), the winner's curse and Spearman's ρ against the sweep scores."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from components.evaluation.intervals import binomial_interval
from components.search_space import identity_changes
from components.sweep.confirmation import (
    Candidate,
    candidates,
    closing_line,
    rows,
    run_name,
    summarise,
    table,
)


def _row(lr: float, mean: float | None, repeat: int = 0) -> dict[str, object]:
    return {"params": {"optim.lr": lr, "loss.name": "simclr"}, "setting_mean": mean,
            "repeat": repeat}


def test_candidates_are_the_best_finished_settings_once_each() -> None:
    trial_rows = [_row(0.1, 0.9), _row(0.1, 0.9, repeat=1), _row(0.2, 0.8), _row(0.3, 0.7),
                  _row(0.4, None)]
    got = candidates(trial_rows, top=3)
    assert [(c.rank, c.params["optim.lr"], c.sweep_score) for c in got] == [
        (1, 0.1, 0.9), (2, 0.2, 0.8), (3, 0.3, 0.7)]
    assert len(candidates(trial_rows, top=10)) == 3  # the failed setting is never confirmed
    assert run_name(got[1], 0) == "rank02-seed0"


def test_confirmed_answer_from_hand_made_hits() -> None:
    rng = np.random.default_rng(0)
    n = 400
    good = rng.random((2, n)) < 0.80  # two seeds each
    twin = good.copy()  # the same per-image hits as the best: difference exactly 0
    poor = rng.random((2, n)) < 0.50
    chosen = [Candidate(1, {"optim.lr": 0.3}, 0.90),  # the sweep's best is the worst here
              Candidate(2, {"optim.lr": 0.1}, 0.85),
              Candidate(3, {"optim.lr": 0.2}, 0.84)]
    conf = summarise({1: list(poor), 2: list(good), 3: list(twin)}, chosen, "test",
                     curse_comparable=True)
    assert conf.images == n and conf.split == "test"
    # Ties on the score are broken by sweep rank; rank 3 is tied (identical hits).
    assert [c.candidate.rank for c in conf.settings] == [2, 3, 1]
    best, tied, worst = conf.settings
    p = float(good.mean())
    assert best.score.value == pytest.approx(p)
    assert best.seed_scores == pytest.approx([good[0].mean(), good[1].mean()])
    # Seed-averaged hits over images: near the binomial interval of the pooled accuracy
    # with the images as the unit (the two seeds' hits are independent here, so narrower).
    lo, hi = binomial_interval(p, n)
    assert best.score.low < p < best.score.high and best.score.high - best.score.low < hi - lo
    assert best.versus_best is None and best.tied
    assert tied.versus_best is not None
    assert (tied.versus_best.value, tied.versus_best.low, tied.versus_best.high) == (0, 0, 0)
    assert tied.tied and conf.tied() == [tied]
    assert worst.versus_best is not None and worst.versus_best.high < 0 and not worst.tied
    assert best.curse == pytest.approx(0.85 - p)
    assert worst.curse == pytest.approx(0.90 - float(poor.mean()))
    want = spearmanr([0.85, 0.84, 0.90], [p, p, float(poor.mean())]).statistic
    assert conf.spearman == pytest.approx(want) and conf.spearman < 0
    text = table(conf, "knn_top1")
    assert text.splitlines()[2].startswith(f"| 1 | 2 | 0.85 | {100 * p:.1f} [")
    line = closing_line(conf, 2)
    assert line.startswith(f"confirmed best (sweep rank 2): test kNN top-1 {100 * p:.1f} % [")
    assert "statistically tied with it: sweep rank 3" in line
    assert f"winner's curse {100 * (0.85 - p):+.1f} points" in line
    assert "Spearman ρ = -0.87" in line
    assert [r["sweep_rank"] for r in rows(conf)] == [2, 3, 1]


def test_no_curse_when_the_sweep_metric_is_not_the_confirmed_one() -> None:
    hits = {1: [np.array([1, 0, 1, 1])], 2: [np.array([0, 0, 1, 1])]}
    conf = summarise(hits, [Candidate(1, {}, 0.3), Candidate(2, {}, 0.4)], "test",
                     curse_comparable=False)
    assert all(c.curse is None for c in conf.settings) and conf.spearman is None
    assert "winner's curse" not in closing_line(conf, 1)
    with pytest.raises(ValueError, match=r"different numbers of images \(\[3, 4\]\)"):
        summarise({1: [np.ones(4)], 2: [np.ones(3)]},
                  [Candidate(1, {}, 0.3), Candidate(2, {}, 0.4)], "test", True)


def test_a_confirm_section_added_later_is_not_a_change_of_the_experiment() -> None:
    started = {"sweep": {"name": "s", "space": {"optim.lr": {"uniform": [0, 1]}}},
               "base": {}, "overrides": [], "sweep_file": "f", "base_file": "b"}
    now = {**started, "sweep": {**started["sweep"], "confirm": {"top": 2}}}
    assert identity_changes(started, now) == []
    edited = {**now, "sweep": {**now["sweep"], "num_samples": 9}}
    assert identity_changes(started, edited) == ["sweep file f: num_samples"]

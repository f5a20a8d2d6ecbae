"""A sweep's confirmation stage: the ``top`` best settings retrained with ``seeds`` fresh
seeds and scored on a split no trial was chosen on (``confirm: {top, seeds, split}`` in the
sweep file, :class:`~components.search_space.Confirm`).

Why: a sweep picks its winner by the maximum of noisy scores on the val split, so the
winner's score is biased upwards (the *winner's curse*) and the runner-up may be as good. The
confirmed answer is the setting with the best mean test kNN top-1 over fresh seeds, with

* a 95 % bootstrap interval over the test images of its seed-averaged per-image hits
  (:func:`components.evaluation.intervals.mean_interval`),
* every other confirmed setting's **paired** difference to it over the same images
  (:func:`~components.evaluation.intervals.paired_mean_difference`): *tied* when that
  interval holds 0,
* the drop from its sweep score to its confirmed score (only when the sweep's metric is the
  kNN top-1 it is confirmed on), and
* the rank agreement (Spearman's ρ, ``scipy.stats.spearmanr``) between sweep scores and
  confirmed scores over the confirmed settings.

Each run is trained and scored by :mod:`components.sweep.confirm_runs`; this module
chooses what to confirm, names the runs and summarises their per-image hits.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from components.evaluation.intervals import Interval, mean_interval, paired_mean_difference

SEED_OFFSET = 1000  # confirmation seeds: train.seed + SEED_OFFSET + j, never a sweep's seed


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A setting chosen for confirmation: its sweep rank (1 = the sweep's best), parameters
    and sweep score (its setting mean)."""

    rank: int
    params: dict[str, Any]
    sweep_score: float


def candidates(rows: Sequence[Mapping[str, Any]], top: int) -> list[Candidate]:
    """The ``top`` best finished settings of a sweep's trial rows (sorted best first, as
    ``components.sweep.results.trial_rows`` returns them), one per setting."""
    out: list[Candidate] = []
    seen: set[str] = set()
    for row in rows:
        key = repr(sorted(row["params"].items()))
        if row.get("setting_mean") is None or key in seen:
            continue
        seen.add(key)
        out.append(Candidate(len(out) + 1, dict(row["params"]), float(row["setting_mean"])))
        if len(out) == top:
            break
    return out


def run_name(candidate: Candidate, seed_index: int) -> str:
    """The run dir name of one confirmation run (deterministic: a re-run resumes it)."""
    return f"rank{candidate.rank:02d}-seed{seed_index}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Confirmed:
    """One confirmed setting.

    Attributes:
        candidate: what was confirmed.
        seed_scores: test kNN top-1 of each seed's run.
        score: the per-image hits averaged over seeds, then over images (= the mean of
            ``seed_scores`` when every run saw the same images), with its bootstrap interval.
        versus_best: this setting minus the confirmed best, paired over the test images
            (``None`` for the best itself).
        tied: the best's, or ``versus_best``'s interval holds 0.
        curse: sweep score minus confirmed score (``None``: the sweep's metric is not the
            confirmed kNN top-1, so the two are not on one scale).
    """

    candidate: Candidate
    seed_scores: list[float]
    score: Interval
    versus_best: Interval | None
    tied: bool
    curse: float | None

    @property
    def seed_sd(self) -> float | None:
        s = self.seed_scores
        if len(s) < 2:
            return None
        m = sum(s) / len(s)
        return math.sqrt(sum((x - m) ** 2 for x in s) / (len(s) - 1))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Confirmation:
    """The confirmed answer of a sweep: every confirmed setting, best first, and the rank
    agreement between sweep and confirmed scores."""

    settings: list[Confirmed]
    spearman: float | None  # None: fewer than 3 settings, or a constant column
    split: str
    images: int
    # The kNN rule the runs were scored by (components.evaluation.knn.KnnRule.name: the
    # online monitor's and `simgraph evaluate`'s), named wherever the score is shown.
    rule: str = "kNN top-1"

    @property
    def best(self) -> Confirmed:
        return self.settings[0]

    def tied(self) -> list[Confirmed]:
        return [c for c in self.settings[1:] if c.tied]


def summarise(hits: Mapping[int, Sequence[np.ndarray]], chosen: Sequence[Candidate],
              split: str, curse_comparable: bool, rule: str = "kNN top-1") -> Confirmation:
    """Summarise the per-image hits (``hits[rank]``: one bool/0-1 array per seed, every
    array over the same test images in the same order) of the confirmed ``chosen``;
    ``rule``: the name of the kNN rule they were scored by
    (:meth:`components.evaluation.knn.KnnRule.name`).

    Raises:
        ValueError: a candidate without runs, or runs scored on different numbers of images.
    """
    from scipy.stats import spearmanr

    runs = {c.rank: [np.asarray(h, dtype=np.float64).ravel() for h in hits.get(c.rank, [])]
            for c in chosen}
    empty = [rank for rank, r in runs.items() if not r]
    if empty:
        raise ValueError(f"the settings of sweep rank {empty} have no confirmed run")
    sizes = {len(h) for r in runs.values() for h in r}
    if len(sizes) != 1:
        raise ValueError(f"the confirmation runs were scored on different numbers of images "
                         f"({sorted(sizes)}): they must share one {split} split")
    # Per image: the fraction of a setting's seeds that got it right.
    averaged = {rank: np.mean(np.stack(r), axis=0) for rank, r in runs.items()}
    order = sorted(chosen, key=lambda c: (-float(averaged[c.rank].mean()), c.rank))
    best = averaged[order[0].rank]
    out = []
    for c in order:
        mine = averaged[c.rank]
        score = mean_interval(mine)
        versus = None if c is order[0] else paired_mean_difference(mine, best)
        out.append(Confirmed(
            candidate=c,
            seed_scores=[float(h.mean()) for h in runs[c.rank]],
            score=score, versus_best=versus,
            tied=versus is None or versus.low <= 0.0 <= versus.high,
            curse=(c.sweep_score - score.value) if curse_comparable else None,
        ))
    rho = None
    if len(out) >= 3:
        x = [c.candidate.sweep_score for c in out]
        y = [c.score.value for c in out]
        if len(set(x)) > 1 and len(set(y)) > 1:
            rho = float(spearmanr(x, y).statistic)
    return Confirmation(settings=out, spearman=rho, split=split, images=int(next(iter(sizes))),
                        rule=rule)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def table(conf: Confirmation, metric: str) -> str:
    """The confirmed settings as a Markdown table, best first."""
    keys = sorted({k for c in conf.settings for k in c.candidate.params})
    head = ["confirmed rank", "sweep rank", f"sweep score ({metric})",
            f"{conf.split} {conf.rule} % [95 % CI]", "per seed %", "vs best (paired) [95 % CI]",
            "tied with best", "sweep − confirmed", *keys]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, c in enumerate(conf.settings, 1):
        v = c.versus_best
        cells = [str(i), str(c.candidate.rank), f"{c.candidate.sweep_score:.4g}",
                 f"{_pct(c.score.value)} [{_pct(c.score.low)}, {_pct(c.score.high)}]",
                 " / ".join(_pct(s) for s in c.seed_scores),
                 "—" if v is None else
                 f"{100 * v.value:+.1f} [{100 * v.low:+.1f}, {100 * v.high:+.1f}]",
                 "best" if v is None else ("yes" if c.tied else "no"),
                 "—" if c.curse is None else f"{100 * c.curse:+.1f} points"]
        cells += [format_value(c.candidate.params.get(k)) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_value(v: Any) -> str:
    """A parameter value in a table cell or a closing line: floats to 4 significant digits,
    ``None`` as a dash (also the sweep's own tables, :mod:`components.sweep.results`)."""
    if v is None:
        return "—"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def closing_line(conf: Confirmation, seeds: int) -> str:
    """The sweep's answer in one line: the confirmed best with its interval, who is tied with
    it, the winner's curse and the rank agreement."""
    b = conf.best
    params = " ".join(f"{k}={format_value(v)}" for k, v in sorted(b.candidate.params.items()))
    tied = conf.tied()
    parts = [f"confirmed best (sweep rank {b.candidate.rank}): {conf.split} {conf.rule} "
             f"{_pct(b.score.value)} % [{_pct(b.score.low)}, {_pct(b.score.high)}] over "
             f"{seeds} fresh seed{'s' if seeds != 1 else ''} and {conf.images} images "
             f"({params})",
             ("statistically tied with it: sweep rank "
              + ", ".join(str(c.candidate.rank) for c in tied)) if tied
             else "no other confirmed setting is tied with it"]
    if b.curse is not None:
        parts.append(f"sweep score {_pct(b.candidate.sweep_score)} % → confirmed "
                     f"{_pct(b.score.value)} % (winner's curse {100 * b.curse:+.1f} points)")
    if conf.spearman is not None:
        parts.append(f"sweep vs confirmed rank agreement: Spearman ρ = {conf.spearman:.2f}")
    return "; ".join(parts)


def rows(conf: Confirmation) -> list[dict[str, Any]]:
    """One plain row per confirmed setting (``confirm.csv`` / ``confirm.json``)."""
    out = []
    for i, c in enumerate(conf.settings, 1):
        v = c.versus_best
        out.append({
            "confirmed_rank": i, "sweep_rank": c.candidate.rank,
            "sweep_score": c.candidate.sweep_score, "split": conf.split, "rule": conf.rule,
            "score": c.score.value, "score_low": c.score.low, "score_high": c.score.high,
            "seed_scores": c.seed_scores, "seed_sd": c.seed_sd,
            "versus_best": None if v is None else v.value,
            "versus_best_low": None if v is None else v.low,
            "versus_best_high": None if v is None else v.high,
            "tied": c.tied, "curse": c.curse, "params": c.candidate.params,
        })
    return out


__all__ = ["SEED_OFFSET", "Candidate", "Confirmation", "Confirmed", "candidates",
           "closing_line", "rows", "run_name", "summarise", "table"]

"""A sweep's figures and the statistics they draw: every trial and setting against each
numeric parameter (:func:`param_figure`), the best setting per loss (:func:`best_per_loss_figure`),
the confirmed settings with their intervals (:func:`plot_confirmed`), settings with their
standard errors (:func:`settings`, :func:`setting_se`, :func:`setting_points`) and the
background import of the plotting stack (:func:`prefetch_plotting`)."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    from components.search_space import SweepConfig
    from components.sweep.confirmation import Confirmation


def prefetch_plotting() -> None:
    """Import matplotlib and Optuna's plotting in a background thread while the trials run
    (the driver mostly waits then), so the plots are drawn as soon as the last trial ends:
    1.6 s of imports off every sweep's wall time here. A failed import is left for
    :func:`plot_results` to report."""

    def load() -> None:
        with contextlib.suppress(Exception):
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot  # noqa: F401
            import optuna.importance  # noqa: F401
            import optuna.visualization.matplotlib  # noqa: F401

    threading.Thread(target=load, name="simgraph-prefetch-plotting", daemon=True).start()


def numeric_params(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The numeric parameters of the finished trials (a plot against each)."""
    return sorted({k for r in rows if r["score"] is not None for k, v in r["params"].items()
                   if isinstance(v, int | float) and not isinstance(v, bool)})


def plot_confirmed(sweep: SweepConfig, rows: Sequence[dict[str, Any]], conf: Confirmation,
                   out: Path) -> None:
    """The metric-vs-parameter plots again, with the confirmed settings marked (only when the
    sweep's metric is the kNN top-1 they are confirmed on: one axis)."""
    if sweep.metric != "knn_top1":
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for k in numeric_params(rows):
        fig = param_figure(sweep, rows, k, confirmed=conf)
        fig.savefig(out / f"{sweep.metric}_vs_{k}.png", dpi=110)
        plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Settings with their uncertainty: what the plots draw and what gates the importances.


def settings(rows: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The finished trials (a score) grouped by setting (``params``), in the rows' order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["score"] is not None:
            groups.setdefault(repr(sorted(r["params"].items())), []).append(r)
    return list(groups.values())


SeBasis = Literal["seeds", "curve"]


def setting_se(members: Sequence[dict[str, Any]], sweep: SweepConfig
               ) -> tuple[float | None, SeBasis | None]:
    """The standard error of a setting's mean (``setting_mean`` of its finished trials
    ``members``) and what it rests on, or ``(None, None)`` when nothing tells:

    - ``"seeds"``: two or more finished repeats: ``setting_sd / sqrt(setting_n)``, the
      standard error of the mean over seeds;
    - ``"curve"``: one finished trial (one seed) of ``knn_top1`` or ``probe_top1``
      (accuracies on a held-out split: :data:`~components.search_space.ACCURACY_METRICS`)
      whose curve has >= 2 evaluations: the sample sd of its last ``max(k, 2)`` evaluations
      (``k = sweep.statistic.k``) divided by the square root of the evaluations its score
      averages (``min(k, len(curve))`` for ``mean_last``, 1 for ``last`` / ``best``).
      Epoch-to-epoch moves of the kNN on a small val split are mostly noise; a curve still
      rising adds its trend (the probe's, which keeps learning, more), so this errs on the
      large side. Not for other metrics (a falling loss is trend, not noise). (A trial's
      binomial ``knn_top1_se`` is not used: every setting is scored on the same val split,
      so that error is shared by the settings a plot compares, not what tells them apart.)
    """
    n = members[0]["setting_n"] if members else 0
    if n > 1 and members[0]["setting_sd"] is not None:
        return float(members[0]["setting_sd"]) / math.sqrt(n), "seeds"
    if len(members) != 1:
        return None, None
    row = members[0]
    values = [v for _, v in row.get("curve") or []]
    from components.search_space import ACCURACY_METRICS

    if sweep.metric not in ACCURACY_METRICS or len(values) < 2:
        return None, None
    k = sweep.statistic.k
    tail = values[-max(k, 2):]
    mean = sum(tail) / len(tail)
    sd = math.sqrt(sum((v - mean) ** 2 for v in tail) / (len(tail) - 1))
    averaged = min(k, len(values)) if sweep.statistic.name == "mean_last" else 1
    return sd / math.sqrt(averaged), "curve"


class SettingPoint(NamedTuple):
    """One setting in a plot: the parameter's value, the setting's mean score, the standard
    error of that mean (:func:`setting_se`; None: no bar) and its loss (``""`` if not swept)."""

    x: float
    mean: float
    se: float | None
    loss: str


def setting_points(rows: Sequence[dict[str, Any]], sweep: SweepConfig,
                   param: str) -> list[SettingPoint]:
    """Every finished setting that has ``param``, by loss then ``param``'s value."""
    pts = [SettingPoint(group[0]["params"][param], group[0]["setting_mean"],
                        setting_se(group, sweep)[0], str(group[0]["params"].get("loss.name", "")))
           for group in settings(rows) if param in group[0]["params"]]
    return sorted(pts, key=lambda p: (p.loss, p.x))


def _se_caption(sweep: SweepConfig, groups: Sequence[Sequence[dict[str, Any]]]) -> str:
    """What the error bars of ``groups`` (settings) are, for a figure's caption."""
    bases = {setting_se(g, sweep)[1] for g in groups}
    k, stat = sweep.statistic.k, sweep.statistic.name
    said = {
        "seeds": "± standard error of the mean over seeds (sd/√n)",
        "curve": (f"one seed: ± sd/√{k} of its last {k} {sweep.metric} evaluations"
                  if stat == "mean_last" else
                  f"one seed: ± sd of its last {max(k, 2)} {sweep.metric} evaluations"),
    }
    parts = [said[b] for b in ("seeds", "curve") if b in bases]
    if not parts:
        return "no error bars: one seed per setting and no estimate of its noise"
    if None in bases:
        parts.append("no bar: no estimate")
    if any(len(g) > 1 for g in groups):
        parts.append("faint dots: each seed")
    return "error bars: " + "; ".join(parts)


def _loss_colours(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    losses = sorted({str(r["params"].get("loss.name", "")) for r in rows})
    return {loss: f"C{i}" for i, loss in enumerate(losses)}


# A setting's seeds: small faint dots, drawn 6 points right of its mean (with two seeds they
# lie exactly at the ends of its error bar, under the caps).
_SEED_DOTS: dict[str, Any] = {"s": 12, "alpha": 0.45, "linewidths": 0, "zorder": 3}


def _beside(fig: Any, ax: Any) -> Any:
    from matplotlib.transforms import offset_copy

    return offset_copy(ax.transData, fig, x=6, y=0, units="points")


def _ylabel(sweep: SweepConfig, groups: Sequence[Sequence[dict[str, Any]]], what: str = "") -> str:
    k = sweep.statistic.k
    score = {"mean_last": f"mean of last {k}", "last": "last", "best": "best epoch"}
    seeds = ", mean over seeds" if any(len(g) > 1 for g in groups) else ""
    return f"{what}{sweep.metric} ({score[sweep.statistic.name]}){seeds}"


def _caption(ax: Any, text: str) -> None:
    import textwrap

    ax.set_title(textwrap.fill(text, 62), fontsize=6.5)


def param_figure(sweep: SweepConfig, rows: Sequence[dict[str, Any]], param: str,
                 confirmed: Any = None) -> Any:
    """The metric against ``param`` (X-CLR Fig. 3c's view for τ_s): each setting at its mean
    with ± its standard error (:func:`setting_points`), its seeds' scores (with repeats) as
    faint dots beside it, a colour per loss, a log axis for a log distribution; the caption
    says what the bars are. ``confirmed`` (a :class:`~components.sweep.confirmation.Confirmation`,
    when the sweep's metric is the kNN top-1 it confirms): each confirmed setting's score on
    its split as a black diamond with its 95 % interval, the confirmed best filled."""
    import matplotlib.pyplot as plt

    groups = [g for g in settings(rows) if param in g[0]["params"]]
    pts = setting_points(rows, sweep, param)
    colours = _loss_colours([g[0] for g in groups])
    fig, ax = plt.subplots(figsize=(4.8, 3.6))
    for loss in colours:  # the seeds of settings with repeats, faint, beside their mean
        seeds = [r for g in groups if len(g) > 1
                 and str(g[0]["params"].get("loss.name", "")) == loss for r in g]
        if seeds:
            ax.scatter([r["params"][param] for r in seeds], [r["score"] for r in seeds],
                       transform=_beside(fig, ax), **_SEED_DOTS, color=colours[loss])
    for loss in sorted({p.loss for p in pts}):
        mine = [p for p in pts if p.loss == loss]
        ax.errorbar([p.x for p in mine], [p.mean for p in mine],
                    yerr=[p.se if p.se is not None else math.nan for p in mine], fmt="o", ms=5,
                    capsize=3, elinewidth=1, color=colours[loss], label=loss or None,
                    zorder=2)
    caption = _se_caption(sweep, groups)
    marked = [c for c in (confirmed.settings if confirmed is not None else [])
              if param in c.candidate.params]
    for i, c in enumerate(marked):
        v = c.score
        ax.errorbar([c.candidate.params[param]], [v.value],
                    yerr=[[v.value - v.low], [v.high - v.value]], fmt="D",
                    ms=6, capsize=3, color="k", mfc="k" if c is confirmed.best else "none",
                    zorder=4, label=f"confirmed ({confirmed.split})" if i == 0 else None)
    if marked:
        caption += (f"; diamonds: confirmed on the {confirmed.split} split (95 % interval, "
                    "the best filled)")
    dists = sweep.parameters()
    if param in dists and dists[param].log:
        _log_axis(ax)
    ax.set_xlabel(param)
    ax.set_ylabel(_ylabel(sweep, groups), fontsize=8)
    _caption(ax, caption)
    if any(p.loss for p in pts) or marked:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def best_per_loss_figure(sweep: SweepConfig, rows: Sequence[dict[str, Any]]) -> Any:
    """The best setting of each loss (by its mean, as the tables rank them) with ± its
    standard error (:func:`setting_se`), its seeds' scores (with repeats) as faint dots."""
    import matplotlib.pyplot as plt

    sign = 1.0 if sweep.mode == "max" else -1.0
    best: dict[str, list[dict[str, Any]]] = {}
    for g in settings(rows):
        loss = g[0]["params"].get("loss.name")
        if loss is not None and (str(loss) not in best or sign * g[0]["setting_mean"]
                                 > sign * best[str(loss)][0]["setting_mean"]):
            best[str(loss)] = g
    losses = sorted(best)
    colours = _loss_colours([g[0] for g in best.values()])
    fig, ax = plt.subplots(figsize=(4.8, 3.6))
    for i, loss in enumerate(losses):
        g = best[loss]
        se = setting_se(g, sweep)[0]
        ax.bar(i, g[0]["setting_mean"], yerr=se if se is not None else None, capsize=4,
               color=colours[loss], alpha=0.8)
        if len(g) > 1:
            ax.scatter([i] * len(g), [r["score"] for r in g], transform=_beside(fig, ax),
                       **_SEED_DOTS, color="k")
    ax.set_xticks(range(len(losses)), losses)
    ax.set_ylabel(_ylabel(sweep, list(best.values()), "best setting's "), fontsize=8)
    _caption(ax, _se_caption(sweep, list(best.values())))
    fig.tight_layout()
    return fig


def _log_axis(ax: Any, which: str = "x") -> None:
    """A log axis whose labels do not collide: plain numbers at 1-2-5 major ticks, no minor
    labels (matplotlib labels minor ticks of a narrow log range, e.g. 0.05-0.5, and they
    overlap)."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    axis = ax.xaxis if which == "x" else ax.yaxis
    if which == "x":
        ax.set_xscale("log")
    else:
        ax.set_yscale("log")
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=6))
    formatter = ScalarFormatter()
    formatter.set_scientific(False)
    axis.set_major_formatter(formatter)
    axis.set_minor_formatter(NullFormatter())
    if which == "x":
        ax.tick_params(axis="x", labelrotation=30)

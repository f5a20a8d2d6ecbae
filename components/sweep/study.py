"""A sweep's Optuna study: built from the finished trials (:func:`_study`), its plots and
parameter importances (with when they are supported: :func:`importance_support`), and its
export to ``study_storage`` (:func:`check_study_storage`, :func:`export_study`), owned by one
sweep dir (:data:`STUDY_OWNER`)."""

from __future__ import annotations

import contextlib
import re
import statistics
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from components.io.files import write_text
from components.sweep.layout import SweepError, sweep_dir
from components.sweep.plots import (
    _log_axis,
    best_per_loss_figure,
    numeric_params,
    param_figure,
    setting_se,
    settings,
)

if TYPE_CHECKING:
    from components.search_space import SweepConfig


@contextlib.contextmanager
def optuna_console() -> Iterator[None]:
    """Optuna while the searcher is built and the sweep's results are drawn and exported: its
    INFO lines ("A new study created in memory / in RDB") and repeated importance warnings
    ("Some regimes for parameter ... have less than 2 trials") only with ``--verbose``; quiet,
    the warnings become one line."""
    import warnings

    import optuna

    from components.runtime import console

    if console.verbose():
        yield
        return
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        optuna.logging.set_verbosity(level)
    rough = sorted({m.group(1) for w in caught
                    if (m := re.search(r"parameter `(.+?)` have less than 2 trials",
                                       str(w.message)))})
    if rough:
        print(f"simgraph sweep: parameter importances are rough: some values of "
              f"{', '.join(rough)} have fewer than 2 trials", file=sys.stderr)
    for w in caught:
        if "have less than 2 trials" not in str(w.message):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _optuna_plots(study: Any, out: Path, ranked: Sequence[str],
                  pair: Sequence[str] = ()) -> None:
    """Optuna's matplotlib visualisations of the finished trials (each a PNG; one that Optuna
    cannot draw for this study is skipped with a note, the others are still written):
    importances when ``ranked`` (the parameters by importance) has two or more, a contour of
    ``pair`` (default: the two most important)."""
    import warnings

    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as ovm

    views: dict[str, Any] = {
        "optuna_history.png": lambda: ovm.plot_optimization_history(study),
        "optuna_slice.png": lambda: ovm.plot_slice(study),
    }
    if len(ranked) >= 2:
        views["optuna_importances.png"] = lambda: ovm.plot_param_importances(study)
    contour = list(pair or ranked)[:2]
    if len(contour) == 2:
        views["optuna_contour.png"] = lambda: ovm.plot_contour(study, params=contour)
    for name, draw in views.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                ax = draw()
            fig = (ax.flat[0] if hasattr(ax, "flat") else ax).get_figure()
            for a in fig.axes:  # Optuna's log axes label their minor ticks too: they collide
                if a.get_xscale() == "log":
                    _log_axis(a)
                if a.get_yscale() == "log":
                    _log_axis(a, "y")
            fig.savefig(out / name, dpi=110, bbox_inches="tight")
            plt.close(fig)
        except (ValueError, RuntimeError, ImportError) as e:
            print(f"simgraph sweep: no {name} ({e})", file=sys.stderr)
            plt.close("all")


def _study(sweep: SweepConfig, rows: Sequence[dict[str, Any]], storage: Any = None) -> Any:
    """An Optuna study holding the finished trials (value = best metric), failed ones FAIL."""
    import optuna

    from components.search_space import optuna_distributions

    dists = optuna_distributions(sweep)
    direction: Literal["maximize", "minimize"] = "maximize" if sweep.mode == "max" else "minimize"
    if storage is not None and study_owner(storage, sweep.name) == _owner(sweep):
        optuna.delete_study(study_name=sweep.name, storage=storage)  # ours: written again
    study = optuna.create_study(study_name=sweep.name, storage=storage, direction=direction)
    if storage is not None:
        study.set_user_attr(STUDY_OWNER, _owner(sweep))
    seen: set[str] = set()
    for r in rows:  # one Optuna trial per setting: the mean over its repeats, as the searcher
        key = repr(sorted(r["params"].items()))
        if key in seen:
            continue
        seen.add(key)
        params = {k: v for k, v in r["params"].items() if k in dists}
        value = r["setting_mean"]
        state = (optuna.trial.TrialState.COMPLETE if value is not None
                 else optuna.trial.TrialState.FAIL)
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions={k: dists[k] for k in params},
            value=value, state=state, user_attrs={"trial": r["trial"]},
        ))
    return study


def importance_support(sweep: SweepConfig, rows: Sequence[dict[str, Any]]) -> str | None:
    """Why the finished settings of ``rows`` cannot support parameter importances (one line),
    or None when they can. Over the finished settings (distinct ``params`` with a score; the
    repeats of a setting count once), two rules:

    1. Enough settings: at least ``max(4, 2 * P)``, ``P`` the number of swept parameters
       (``sweep.parameters()``: unconditional and every branch's). fANOVA fits a random
       forest to (setting -> mean score); with fewer settings its ranking reflects where the
       few points happen to lie.
    2. A spread above the noise: ``spread`` is the sample standard deviation of the
       settings' means, ``noise`` the median of their standard errors (:func:`setting_se`;
       settings without one left out). When ``spread <= 2 * noise`` the means differ by no
       more than a setting's own seeds or evaluations do, and importances would rank noise.
       When no setting has a standard error the noise is unknown and only rule 1 applies.
    """
    groups = settings(rows)
    means = [float(g[0]["setting_mean"]) for g in groups]
    n_params = len(sweep.parameters())
    needed = max(4, 2 * n_params)
    if len(means) < needed:
        return (f"{len(means)} finished setting{'s' * (len(means) != 1)} for {n_params} swept "
                f"parameter{'s' * (n_params != 1)}: importances need at least {needed} "
                "(max(4, 2 × parameters))")
    ses = sorted(se for g in groups if (se := setting_se(g, sweep)[0]) is not None)
    if not ses:
        return None
    noise = statistics.median(ses)
    spread = statistics.stdev(means)
    if spread <= 2 * noise:
        return (f"the {len(means)} settings' means spread by sd {spread:.3g}, within 2 × "
                f"their median standard error {noise:.3g}: their differences are noise")
    return None


def param_importances(sweep: SweepConfig, rows: Sequence[dict[str, Any]],
                      study: Any = None) -> dict[str, float]:
    """Optuna's (fANOVA) importances of the swept parameters, or ``{}`` (with one line on
    stderr saying why) where the data does not support them (:func:`importance_support`);
    ``study``: :func:`_study` of ``rows`` when the caller has built it already."""
    import optuna

    reason = importance_support(sweep, rows)
    if reason is not None:
        print(f"simgraph sweep: no parameter importances (param_importances.yaml, "
              f"optuna_importances.png): {reason}", file=sys.stderr)
        return {}
    try:
        return {k: float(v) for k, v in optuna.importance.get_param_importances(
            study if study is not None else _study(sweep, rows)).items()}
    except (RuntimeError, ValueError) as e:  # e.g. a single distinct value per parameter
        print(f"simgraph sweep: no parameter importances ({e})", file=sys.stderr)
        return {}


STUDY_OWNER = "simgraph_sweep_dir"  # user attr: the sweep dir whose trials the study holds


def _owner(sweep: SweepConfig) -> str:
    from components.io.storage import display

    return display(sweep_dir(sweep))


def study_owner(storage: Any, name: str) -> str | None:
    """The sweep dir that wrote study ``name`` in ``storage``; ``""`` for a study simgraph did
    not write, ``None`` when there is none."""
    import optuna

    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None
    return str(study.user_attrs.get(STUDY_OWNER, ""))


def _study_storage(spec: str) -> Any:
    import optuna

    if spec.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(spec[len("journal:"):]))
    return optuna.storages.RDBStorage(spec)


def check_study_storage(sweep: SweepConfig) -> None:
    """Before a sweep starts: ``study_storage`` must not hold a study of this name that
    another sweep (or a person) wrote — exporting would replace it.

    Raises:
        SweepError: naming the storage, the study and the ways out.
    """
    if not sweep.study_storage:
        return
    with optuna_console():
        owner = study_owner(_study_storage(sweep.study_storage), sweep.name)
    if owner not in (None, _owner(sweep)):
        who = f"sweep {owner}" if owner else "someone else (not a simgraph sweep)"
        raise SweepError(
            f"study_storage={sweep.study_storage!r} already holds a study named {sweep.name!r} "
            f"written by {who}; exporting this sweep would replace it. Set study_storage to "
            "another file, or name= another sweep")


def export_study(sweep: SweepConfig, rows: Sequence[dict[str, Any]]) -> None:
    """Write the trials to ``study_storage`` (``sqlite:///…`` or ``journal:<file>``) so the
    study opens in Optuna's API and dashboard."""
    assert sweep.study_storage, "export_study needs study_storage"  # its callers check it
    storage = _study_storage(sweep.study_storage)
    if study_owner(storage, sweep.name) not in (None, _owner(sweep)):  # appeared meanwhile
        raise SweepError(f"study_storage={sweep.study_storage!r} now holds another study named "
                         f"{sweep.name!r}; not replaced — the results are in "
                         f"{_owner(sweep)} (trials.csv)")
    with optuna_console():
        _study(sweep, rows, storage)


def plot_results(sweep: SweepConfig, rows: Sequence[dict[str, Any]], out: Path) -> None:
    """PNGs beside trials.md: the metric against each numeric parameter and the best setting
    per loss (each setting at its mean with an error bar, :func:`setting_se`; with repeats
    each seed a faint dot; log axes for log distributions, readable ticks), every trial's
    learning curve in one figure, and Optuna's own matplotlib views (optimisation history,
    slice, parameter importances where the data supports them (:func:`importance_support`),
    a contour of the two most important parameters, or of the first two swept ones without
    importances)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    good = [r for r in rows if r["score"] is not None]
    for k in numeric_params(rows):  # e.g. metric vs tau_s: X-CLR Fig. 3c
        fig = param_figure(sweep, rows, k)
        fig.savefig(out / f"{sweep.metric}_vs_{k}.png", dpi=110)
        plt.close(fig)
    if any(r["params"].get("loss.name") is not None for r in good):
        fig = best_per_loss_figure(sweep, rows)
        fig.savefig(out / "best_per_loss.png", dpi=110)
        plt.close(fig)
    curves = [r for r in rows if r.get("curve")]
    if curves:
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for r in curves:
            ax.plot([e for e, _ in r["curve"]], [v for _, v in r["curve"]], marker=".",
                    linewidth=1, label=f"{r['trial']} ({r['status']})")
        ax.set_xlabel("epoch")
        ax.set_ylabel(sweep.metric)
        if len(curves) <= 12:
            ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / "learning_curves.png", dpi=110)
        plt.close(fig)
    if len(good) < 2:
        return
    with optuna_console():
        study = _study(sweep, rows)
        importances = param_importances(sweep, rows, study)
        if importances:
            write_text(out / "param_importances.yaml", yaml.safe_dump(importances))
        swept = [k for k in sweep.parameters() if any(k in r["params"] for r in good)]
        _optuna_plots(study, out, list(importances), pair=list(importances)[:2] or swept[:2])

"""components.runtime.console: what quiet mode drops and keeps, and the lines a run prints."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from components.config import PretrainConfig, from_dict
from components.runs.dataset_checks import RunFacts
from components.runs.summary import run_summary
from components.runtime import console

ROOT = Path(__file__).resolve().parents[2]

RAY_LINES = [
    "Reporting training result 3: TrainingReport(checkpoint=None, metrics={'epoch': 3}) from "
    "rank 0",
    "Checkpoint successfully created at: Checkpoint(filesystem=local, path=/r/epoch_00002)",
    "Setting up process group for: env:// [rank=0, world_size=2]",
    "- (ip=127.0.0.1, pid=11123) world_rank=0, local_rank=0, node_rank=0",
]
HARMLESS_LINES = [
    "[W1123 22:15:58.829405680 socket.cpp:207] [c10d] The hostname of the client socket cannot "
    "be retrieved. err=-3",
    "[2026-11-23 22:15:58,958 E 11051 11084] core_worker.cc:2465: Actor with class name: "
    "'PreemptionWatcher' and ID: '57' has constructor arguments in the object store and "
    "max_restarts > 0. If the arguments ...",
]
REAL_LINES = [
    "[FailurePolicy] RETRY",
    "RuntimeError: loss is not finite at epoch 2 step 3",
    "UserWarning: something the user should see",
    "[simgraph] epoch 1/2  loss 5.2853",
]


def test_quiet_filter_drops_chatter_and_harmless_lines_and_keeps_the_rest(
        capsys: pytest.CaptureFixture[str]) -> None:
    before = console.hidden_counts()
    kept = console.filter_lines([*RAY_LINES, *HARMLESS_LINES, *REAL_LINES])
    assert kept == REAL_LINES
    after = console.hidden_counts()
    assert after.get("c10d-hostname", 0) == before.get("c10d-hostname", 0) + 1
    assert after.get("actor-restart-args", 0) == before.get("actor-restart-args", 0) + 1


def test_forwarded_output_our_lines_without_prefix_harmless_actor_dropped(
        capsys: pytest.CaptureFixture[str]) -> None:
    got: list[dict] = []
    emit = console._filtered(got.append)
    emit({"lines": ["[simgraph] epoch 1/2  loss 1.0", "a real line", RAY_LINES[0]],
          "pid": 7, "is_err": False, "actor_name": "RayTrainWorker"})
    emit({"lines": ["Traceback (most recent call last):", "ConnectionError: ..."],
          "pid": 8, "is_err": True, "actor_name": "PlacementGroupCleaner"})
    assert capsys.readouterr().out == "[simgraph] epoch 1/2  loss 1.0\n"
    assert got == [{"lines": ["a real line"], "pid": 7, "is_err": False,
                    "actor_name": "RayTrainWorker"}]


def test_epoch_and_progress_lines() -> None:
    row = {"epoch": 3, "loss": 3.91234, "lr": 0.001, "knn_top1": 0.7843, "samples_per_s": 620.4,
           "data_wait": 0.031, "time_s": 12.2}
    assert console.epoch_line(row, 15, 144.0) == (
        "[simgraph] epoch 3/15  loss 3.9123  lr 0.001  kNN 78.4 %  620 img/s  data-wait 3 %  "
        "12 s  ETA 2:24")
    # with its standard error over the query images, as the recipe reports it
    assert "  kNN 78.4 ± 1.3 %  " in console.epoch_line({**row, "knn_top1_se": 0.0131}, 15, 1.0)
    # the online linear probe's, after the kNN's
    assert "  kNN 78.4 %  probe 81.0 ± 1.2 %  620 img/s" in console.epoch_line(
        {**row, "probe_top1": 0.8104, "probe_top1_se": 0.0123}, 15, 1.0)
    last = {**row, "epoch": 15}
    last.pop("knn_top1")
    assert "ETA" not in console.epoch_line(last, 15, 0.0) and "kNN" not in console.epoch_line(
        last, 15, 0.0)
    assert console.progress_line(3, 15, 40, 84, 3.9, 612.0, 13.0) == (
        "[simgraph] epoch 3/15  step 40/84 (47 %)  loss 3.9000  612 img/s  epoch ETA 13 s")
    assert [console.duration(s) for s in (0.4, 59, 61, 3725)] == ["0 s", "59 s", "1:01",
                                                                  "1:02:05"]


def test_run_summary_shows_the_effective_learning_rate_and_how_it_was_derived() -> None:
    cfg = from_dict(PretrainConfig, {
        "name": "demo", "data": {"dataset": "/d", "batch_size": 128},
        "optim": {"name": "sgd", "lr": 0.001, "lr_scaling": "linear", "reference_batch": 256,
                  "warmup_epochs": 1},
        "scaling": {"num_workers": 2}, "train": {"epochs": 10}, "knn": {"every_epochs": 0}})
    facts = RunFacts(num_classes=10, caption_dim=0, dataset={}, knn=False, knn_note="",
                     needs_captions=False, splits={"train": 1000, "val": 100, "test": 0})
    text = run_summary(cfg, facts, "/runs/demo")
    assert "peak LR 0.001 = optim.lr 0.001 × 256/256 (lr_scaling linear)" in text
    assert "2 worker(s) x 128 = 256 global" in text and "3 steps/epoch x 10 epochs = 30" in text
    assert "train 1000 · val 100;" in text and "kNN     off (knn.every_epochs 0)" in text
    assert "probe" not in text  # off by default: no line
    probe = from_dict(PretrainConfig, {"name": "d", "data": {"dataset": "/d"},
                                       "probe": {"every_epochs": 2, "weight_decay": 1e-4}})
    assert ("  probe   every 2 epochs (linear on the backbone features, AdamW lr 0.001, weight "
            "decay 0.0001; top-1 on val)") in run_summary(probe, facts, "/r").splitlines()
    one = from_dict(PretrainConfig, {**{"name": "d", "data": {"dataset": "/d", "batch_size": 128}},
                                     "optim": {"lr": 0.001, "lr_scaling": "linear",
                                               "reference_batch": 256}})
    assert "peak LR 0.0005 = optim.lr 0.001 × 128/256" in run_summary(one, facts, "/r")
    step = from_dict(PretrainConfig, {"name": "d", "data": {"dataset": "/d"}, "optim": {
        "schedule": "step", "step_epochs": [6, 8], "step_gamma": 0.1, "warmup_epochs": 0}})
    assert "warm-up 0 epochs, then step x 0.1 at epochs 6, 8" in run_summary(
        step, facts, "/r")


def test_verbose_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    assert not console.verbose() and console.before_ray_init() != {}
    console.set_verbose(True)
    assert console.verbose() and console.before_ray_init() == {}
    console.set_verbose(False)
    assert not console.verbose()


def test_live_bar_draws_progress_events_and_is_erased_before_other_lines(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    screen = io.StringIO()
    monkeypatch.setattr(console, "BAR", console.LiveBar(file=screen))
    got: list[dict] = []
    emit = console._filtered(got.append)
    events = [console.progress_event(2, 15, s, 8, 3.5 - 0.1 * s, 650.0) for s in (2, 5)]
    emit({"lines": events, "pid": 7, "is_err": False, "actor_name": "RayTrainWorker"})
    bar = console.BAR.bar
    assert bar is not None and (bar.n, bar.total) == (5, 8)
    drawn = screen.getvalue()
    assert "epoch 2/15" in drawn and "5/8" in drawn and "loss 3.0000" in drawn
    assert "650 img/s" in drawn
    assert capsys.readouterr().out == ""  # events never print as lines
    # An epoch line (or any other output) erases the bar and prints as it is.
    emit({"lines": ["[simgraph] epoch 2/15  loss 3.1"], "pid": 7, "is_err": False,
          "actor_name": "RayTrainWorker"})
    assert console.BAR.bar is None
    assert capsys.readouterr().out == "[simgraph] epoch 2/15  loss 3.1\n"
    # The next epoch's first event starts a new bar where the worker is.
    emit({"lines": [console.progress_event(3, 15, 4, 8, 2.9, 700.0)], "pid": 7,
          "is_err": False, "actor_name": "RayTrainWorker"})
    assert console.BAR.bar is not None and console.BAR.bar.n == 4 and console.BAR.epoch == 3
    # Other output passes through with the bar cleared and drawn again after it.
    emit({"lines": ["a real warning"], "pid": 7, "is_err": True, "actor_name": "RayTrainWorker"})
    assert console.BAR.bar is not None and got[-1]["lines"] == ["a real warning"]
    console.BAR.close()
    # A malformed event is shown, not swallowed.
    emit({"lines": [console.LIVE_TAG + "{not json"], "pid": 7, "is_err": False,
          "actor_name": "RayTrainWorker"})
    assert screen.getvalue().endswith(console.LIVE_TAG + "{not json\n")


def test_live_bar_only_on_a_terminal_without_verbose(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(console, "_forwarding_filtered", True)
    monkeypatch.setattr(console.sys, "stdout", Tty())
    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    assert console.live()
    monkeypatch.setenv(console.VERBOSE_ENV, "1")
    assert not console.live()
    monkeypatch.delenv(console.VERBOSE_ENV)
    monkeypatch.setattr(console, "_forwarding_filtered", False)  # events would print raw
    assert not console.live()


# ------------------------------------------------------------------------ what commands print


# `simgraph preprocess --verbose` logs no "constructor arguments in the object store" error of
# Ray core: checked on the killed build of
# tests/e2e/test_preprocess.py::test_killed_run_resumes_to_identical_files.


@pytest.fixture
def optuna_records() -> Iterator[list[logging.LogRecord]]:
    """What Optuna's loggers emit (and its own handler would print), at Optuna's default
    verbosity (INFO; other test modules lower it)."""
    import optuna

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.INFO)
    handler = Keep()
    logging.getLogger("optuna").addHandler(handler)
    try:
        yield records
    finally:
        logging.getLogger("optuna").removeHandler(handler)
        optuna.logging.set_verbosity(level)


def _sweep_file(tmp: Path, **over: object) -> Path:
    space = {"name": "quiet", "base": str(ROOT / "pipelines/configs/pretrain/demo.yaml"),
             "storage": str(tmp / "sweeps"), "metric": "knn_top1", "mode": "max",
             "num_samples": 2, "max_concurrent": 1, "searcher": {"name": "random", "seed": 0},
             "space": {"optim.lr": {"loguniform": [0.01, 0.5]}}, **over}
    path = tmp / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


def test_building_the_sweep_searcher_prints_no_optuna_study_line(
        tmp_path: Path, optuna_records: list[logging.LogRecord],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Optuna's INFO "A new study created in memory with name: ..." (OptunaSearch makes its
    study when it is built) only with --verbose; its warnings stay."""
    from components.search_space import load_sweep
    from components.sweep.tuner import make_searcher

    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    sweep = load_sweep(_sweep_file(tmp_path))
    searcher = make_searcher(sweep)
    assert searcher.searcher._ot_study is not None  # the study exists: it was created quietly
    assert not [r for r in optuna_records if "A new study created" in r.getMessage()]
    monkeypatch.setenv(console.VERBOSE_ENV, "1")
    make_searcher(sweep)
    assert [r for r in optuna_records if "A new study created" in r.getMessage()]


def test_exporting_the_study_prints_no_optuna_study_line(
        tmp_path: Path, optuna_records: list[logging.LogRecord],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``study_storage``: the export creates the study in that storage without Optuna's INFO
    "A new study created in RDB with name: ..." line."""
    import optuna

    from components.search_space import load_sweep
    from components.sweep.study import export_study

    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    sweep = load_sweep(_sweep_file(tmp_path, study_storage=url))
    rows = [{"trial": "t1", "params": {"optim.lr": 0.1}, "setting_mean": 0.5}]
    export_study(sweep, rows)
    assert len(optuna.load_study(study_name="quiet", storage=url).trials) == 1
    assert not [r for r in optuna_records if "A new study created" in r.getMessage()]

"""``components/sweep/tune_loggers.py``: the deferred TensorBoard logger writes what Tune's own
``TBXLoggerCallback`` writes (scalars per result, HParams at the end), opens nothing before a
trial's first result, and is the only TBX logger Tune uses once named in
``RAY_TUNE_CALLBACKS``."""

from __future__ import annotations

from pathlib import Path

import pytest
from ray.tune.constants import RAY_TUNE_CALLBACKS_ENV_VAR
from ray.tune.logger import TBXLoggerCallback

from components.sweep.tune_loggers import DeferredTBXLoggerCallback, use_deferred_tensorboard
from tests.support.helpers import tensorboard_events


class _Trial:
    """What ``TBXLoggerCallback`` reads of a Tune ``Trial``."""

    def __init__(self, path: Path) -> None:
        self.local_path = str(path)
        self.evaluated_params = {"loss.name": "xclr", "loss.tau": 0.1}

    def init_local_path(self) -> None:
        Path(self.local_path).mkdir(parents=True, exist_ok=True)


def _feed(callback: TBXLoggerCallback, trial: _Trial) -> None:
    callback.log_trial_start(trial)  # type: ignore[arg-type]
    for it, knn in ((1, 0.5), (2, 0.75)):
        callback.log_trial_result(it, trial,  # type: ignore[arg-type]
                                  {"training_iteration": it, "knn_top1": knn, "epoch": it,
                                   "config": {"loss.tau": 0.1}, "pid": 1})
    callback.log_trial_end(trial)  # type: ignore[arg-type]


def test_deferred_logger_writes_what_tunes_writes(tmp_path: Path) -> None:
    ours, tunes = _Trial(tmp_path / "ours"), _Trial(tmp_path / "tune")
    _feed(DeferredTBXLoggerCallback(), ours)
    _feed(TBXLoggerCallback(), tunes)
    written = tensorboard_events(tmp_path / "ours")
    assert written == tensorboard_events(tmp_path / "tune")
    assert [(t, s, v) for t, s, v in written if t == "ray/tune/knn_top1"] == [
        ("ray/tune/knn_top1", 1, 0.5), ("ray/tune/knn_top1", 2, 0.75)]
    assert {v for _, _, v in written if isinstance(v, str)} == {"hparams"}


def test_nothing_opens_before_the_first_result_and_a_restart_reopens(
        tmp_path: Path) -> None:
    cb, trial = DeferredTBXLoggerCallback(), _Trial(tmp_path / "t")
    cb.log_trial_start(trial)  # type: ignore[arg-type]
    assert not (tmp_path / "t").exists() and not cb._trial_writer
    cb.log_trial_result(1, trial, {"training_iteration": 1, "knn_top1": 0.5})  # type: ignore[arg-type]
    assert len(list((tmp_path / "t").glob("events.out.tfevents.*"))) == 1
    first = cb._trial_writer[trial]
    cb.log_trial_start(trial)  # type: ignore[arg-type]  # restarted: the old writer is closed
    assert not cb._trial_writer and first.file_writer is None  # closed
    cb.log_trial_result(2, trial, {"training_iteration": 2, "knn_top1": 0.6})  # type: ignore[arg-type]
    cb.log_trial_end(trial)  # type: ignore[arg-type]
    # (a new events file; within the same second tensorboardX gives it the old one's name)
    assert ("ray/tune/knn_top1", 2, 0.6) in tensorboard_events(tmp_path / "t")


def test_named_in_the_environment_tune_adds_no_tbx_logger_of_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.tune.utils.callback import _create_default_callbacks

    monkeypatch.setenv(RAY_TUNE_CALLBACKS_ENV_VAR, "ray.tune.logger.CSVLoggerCallback")
    use_deferred_tensorboard()
    use_deferred_tensorboard()  # once only
    import os

    assert os.environ[RAY_TUNE_CALLBACKS_ENV_VAR] == (
        "ray.tune.logger.CSVLoggerCallback,"
        "components.sweep.tune_loggers.DeferredTBXLoggerCallback")
    callbacks = _create_default_callbacks([], metric="knn_top1", mode="max")
    tbx = [c for c in callbacks if isinstance(c, TBXLoggerCallback)]
    assert len(tbx) == 1 and isinstance(tbx[0], DeferredTBXLoggerCallback)

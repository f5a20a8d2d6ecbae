"""The in-trial host (``components/runs/hosts.py``): a one-worker run trained in this process
writes Ray Train's run-dir layout, keeps ``checkpoint.keep`` checkpoints, reports each epoch
with the metric first, and a run interrupted after an epoch resumes to the same weights and
metrics as an uninterrupted one. No Ray: the recipe runs against the host directly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from components.config import ConfigError, PretrainConfig, from_dict
from components.runs.checkpoint import is_complete, load_state, save_state
from components.runs.checkpoints import latest_complete, prune_checkpoints, publish_checkpoint
from components.runs.dataset_checks import check_dataset
from components.runs.hosts import TuneTrial, metric_first
from components.runs.recipe import loop_config
from components.runs.run_dir import prepare_run_dir
from components.runs.worker import PretrainRecipe
from components.search_space import Resources
from tests.support.datasets import synthetic_dataset, tiny_run_config

TIMING = {"samples_per_s", "data_wait", "time_s", "eval_s"}


class Interrupted(Exception):
    pass


class RecordingTrial(TuneTrial):
    """:class:`TuneTrial` that keeps the results it would send to Tune; ``stop_after``: raise
    once that epoch's result is sent (its checkpoint is already in the run dir), as a trial
    killed between epochs."""

    def __init__(self, run_dir: str, keep: int, stop_after: int | None = None) -> None:
        super().__init__(run_dir, keep, "knn_top1")
        self.sent: list[dict[str, Any]] = []
        self.stop_after = stop_after

    def send(self, result: dict[str, Any]) -> None:
        self.sent.append(result)
        if result["epoch"] == self.stop_after:
            raise Interrupted


def _train(cfg: PretrainConfig, stop_after: int | None = None) -> tuple[RecordingTrial, str]:
    facts = check_dataset(cfg)
    run_dir = prepare_run_dir(cfg)
    host = RecordingTrial(run_dir, cfg.checkpoint.keep, stop_after)
    PretrainRecipe(loop_config(cfg, run_dir, facts, pause_at_step=0), host=host).run()
    return host, run_dir


def test_interrupted_in_trial_run_resumes_to_identical_weights(tmp_path: Path) -> None:
    data = synthetic_dataset(tmp_path / "ds", size=16)

    def config(storage: str) -> PretrainConfig:
        return from_dict(PretrainConfig, tiny_run_config(
            data, tmp_path / storage, train__epochs=3,
            scaling={"num_workers": 1, "cpus_per_worker": 1.0}))

    full, full_dir = _train(config("a"))
    assert [r["epoch"] for r in full.sent] == [1, 2, 3]
    assert all(list(r)[:3] == ["knn_top1", "epoch", "lr"] for r in full.sent)
    for r in full.sent:  # the online kNN's binomial standard error over its 32 val images
        p = r["knn_top1"]
        assert r["knn_queries"] == 32
        assert r["knn_top1_se"] == pytest.approx((p * (1 - p) / 32) ** 0.5)
    # Ray Train's layout, checkpoint.keep = 2 newest kept, each complete
    names = sorted(p.name for p in Path(full_dir).glob("epoch_*"))
    assert names == ["epoch_00002", "epoch_00003"]
    assert all(is_complete(Path(full_dir) / n) for n in names)
    assert (Path(full_dir) / "metrics.csv").exists()
    info = json.loads((Path(full_dir) / "workers" / "rank0.json").read_text())
    assert info["amp"] == "none"  # the precision train.amp gave on this worker

    with pytest.raises(Interrupted):
        _train(config("b"), stop_after=2)
    resumed, resumed_dir = _train(config("b"))
    assert [r["epoch"] for r in resumed.sent] == [3]  # epochs 1-2 came from the checkpoint

    a = load_state(Path(full_dir) / "epoch_00003")
    b = load_state(Path(resumed_dir) / "epoch_00003")
    for key, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][key]), key
    assert a["step"] == b["step"]

    def strip(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in row.items() if k not in TIMING} for row in history]

    assert strip(a["history"]) == strip(b["history"])


def test_publish_replaces_a_redone_epoch_and_prune_keeps_the_newest(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for epoch in (1, 2, 3):
        save_state(tmp_path / f"c{epoch}", {"epoch": epoch, "x": torch.tensor([epoch])})
        publish_checkpoint(tmp_path / f"c{epoch}", str(run_dir), epoch)
    save_state(tmp_path / "again", {"epoch": 3, "x": torch.tensor([30])})
    publish_checkpoint(tmp_path / "again", str(run_dir), 3)
    assert load_state(run_dir / "epoch_00003")["x"].item() == 30
    assert not list(run_dir.glob(".*"))  # no temporary copy left
    assert prune_checkpoints(str(run_dir), 2) == ["epoch_00001"]
    assert latest_complete(run_dir) == (3, str(run_dir / "epoch_00003"))
    assert prune_checkpoints(str(run_dir), None) == []
    assert sorted(p.name for p in run_dir.iterdir()) == ["epoch_00002", "epoch_00003"]


def test_metric_first_keeps_every_key() -> None:
    row = {"loss": 1.0, "lr": 0.1, "epoch": 2, "knn_top1": 0.5}
    out = metric_first(row, "knn_top1")
    assert list(out) == ["knn_top1", "epoch", "lr", "loss"] and out == row


def test_resources_mode_decides_where_trials_train() -> None:
    assert Resources().in_trial
    assert Resources().trial_resources() == {"CPU": 1.0}
    assert Resources(gpus_per_worker=1.0, cpus_per_worker=2.0).trial_resources() == {
        "CPU": 2.0, "GPU": 1.0}
    group = Resources(workers=2, cpus_per_worker=0.5)
    assert not group.in_trial and group.trial_resources() == {"CPU": 0.25}
    assert not Resources(mode="worker_group").in_trial
    with pytest.raises(ConfigError, match="resources.mode=in_trial needs resources.workers=1"):
        Resources(workers=2, mode="in_trial")
    with pytest.raises(ConfigError, match="resources.mode='actor' is not allowed: choose one"):
        Resources(mode="actor")  # type: ignore[arg-type]


def test_resume_from_prefers_the_newest_complete_checkpoint() -> None:
    from components.runs.hosts import resume_from

    assert resume_from(None, None) is None
    assert resume_from(3, None) == "ray"
    assert resume_from(3, 3) == "ray"
    assert resume_from(None, 2) == "run_dir"  # the snapshot was lost: never back to epoch 0
    assert resume_from(2, 4) == "run_dir"  # a stale snapshot


def test_train_worker_resumes_from_the_run_dir_when_rays_snapshot_is_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import ray.train

    from components.runs.hosts import TrainWorker

    class Context:
        def get_world_rank(self) -> int:
            return 0

        def get_world_size(self) -> int:
            return 2

    for epoch in (1, 2):
        save_state(tmp_path / f"epoch_{epoch:05d}", {"epoch": epoch, "step": 4 * epoch})
    (tmp_path / "epoch_00003").mkdir()  # an interrupted write: never chosen
    monkeypatch.setattr(ray.train, "get_context", Context)
    snapshot: list[Any] = [None]
    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: snapshot[0])
    worker = TrainWorker(str(tmp_path))
    with worker.latest_checkpoint() as d:
        assert d is not None and load_state(d)["epoch"] == 2
    assert "Ray's run snapshot names no checkpoint; resuming from the run dir's newest " \
           "complete checkpoint epoch_00002" in capsys.readouterr().out
    snapshot[0] = ray.train.Checkpoint.from_directory(str(tmp_path / "epoch_00001"))
    with worker.latest_checkpoint() as d:  # stale: epoch 1 < 2
        assert d is not None and load_state(d)["epoch"] == 2
    snapshot[0] = ray.train.Checkpoint.from_directory(str(tmp_path / "epoch_00002"))
    with worker.latest_checkpoint() as d:
        assert d is not None and load_state(d)["epoch"] == 2
    assert capsys.readouterr().out.count("resuming from the run dir") == 1
    assert TrainWorker(None).run_dir is None


def test_a_checkpoint_that_cannot_be_checked_is_not_taken_for_incomplete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A transient I/O error while checking must not restart a trial from scratch (or from
    an older checkpoint): it is an error, not an incomplete checkpoint."""
    import errno

    from components.runs import checkpoint
    from components.runs.checkpoint import CheckpointUnreadable

    save_state(tmp_path / "epoch_00001", {"epoch": 1, "step": 4})

    def flaky(path: Any, *a: Any, **k: Any) -> str:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(checkpoint, "sha256_file", flaky)
    with pytest.raises(CheckpointUnreadable, match="cannot check .*state.pt: .*Input/output"):
        latest_complete(tmp_path)
    monkeypatch.undo()
    assert latest_complete(tmp_path) == (1, str(tmp_path / "epoch_00001"))


def test_older_checkpoints_are_pruned_only_after_the_new_one_verifies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from components.runs import checkpoint
    from components.runs.checkpoint import CheckpointError

    for epoch in (1, 2):
        save_state(tmp_path / f"epoch_{epoch:05d}", {"epoch": epoch, "step": 4 * epoch})
    new = save_state(tmp_path / "staged", {"epoch": 3, "step": 12})
    host = RecordingTrial(str(tmp_path), keep=1)
    monkeypatch.setattr(checkpoint, "is_complete_at", lambda p: False)  # e.g. a bad copy
    with pytest.raises(CheckpointError, match="did not verify .*older checkpoints are kept"):
        host.report({"epoch": 3, "knn_top1": 0.5}, str(new), 3)
    assert sorted(p.name for p in tmp_path.glob("epoch_*")) == ["epoch_00001", "epoch_00002",
                                                                "epoch_00003"]
    assert host.sent == []
    monkeypatch.undo()
    host.report({"epoch": 3, "knn_top1": 0.5}, str(new), 3)
    assert sorted(p.name for p in tmp_path.glob("epoch_*")) == ["epoch_00003"]

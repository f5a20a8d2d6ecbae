"""A diverged run keeps its last good checkpoint, says where it is and what to change, and a
full disk during a checkpoint costs one line and nothing else (issue 39, found-item 3 and
principle 3; the full disk of item 6).

* A checkpoint is published only if its whole state (weights, BatchNorm statistics, memory
  bank, EMA encoder, optimizer state) is finite: a run whose weights became NaN stops at the
  checkpoint, writes nothing, and the good one it had survives ``checkpoint.keep: 1``.
* The newest finite checkpoint is never pruned nor passed over by a resume
  (``meta.json``'s ``finite``).
* The stop message names that checkpoint (its path) and what to change (``optim.lr``,
  ``train.amp``, ``train.grad_clip``: settings a resume may change), and a re-run resumes from
  it — with a lowered ``optim.lr`` at the LR a run started with it would have.
* ENOSPC while a checkpoint is written (``state.pt`` in the local temp dir, or the copy into
  the run dir): one line naming the file and what to do, the partial copy removed, the older
  checkpoints intact, and the re-run resumes.

No Ray: ``simgraph pretrain``'s in-process host (one CPU worker), as in test_resume_checks.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from components.config import PretrainConfig, from_dict
from components.errors import SimgraphError
from components.runs.checkpoint import STATE, TrainingState, is_complete, read_meta, save_state
from components.runs.checkpoints import latest_complete, prune_checkpoints
from components.runs.recipe import run_pretraining
from components.runs.worker import PretrainRecipe
from components.training import step as training
from tests.support.datasets import synthetic_dataset, tiny_run_config


def _config(data: Path, storage: Path, name: str = "run", **over: Any) -> PretrainConfig:
    return from_dict(PretrainConfig, tiny_run_config(
        data, storage, name=name, knn__every_epochs=0,
        scaling={"num_workers": 1, "cpus_per_worker": 1.0},
        **{"train__epochs": 3, "checkpoint": {"every_epochs": 1, "keep": 1}, **over}))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 32 training images, batch 16: 2 steps per epoch
    return synthetic_dataset(tmp_path_factory.mktemp("div") / "ds", size=16,
                             train_per_class=8, val_per_class=2, seed=0)


def _epochs(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir() if p.name.startswith("epoch_"))


def _poison(model: torch.nn.Module) -> None:
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))


def test_weights_that_diverge_in_an_epoch_are_never_published(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The last step of epoch 2 turns the weights NaN (its loss, read before the step, was
    finite): the checkpoint after epoch 2 is refused, epoch 1's survives keep=1."""
    cfg = _config(data, tmp_path / "runs")
    run_dir = tmp_path / "runs" / "run"
    real = PretrainRecipe.train_epoch

    def diverging(self: PretrainRecipe, epoch: int) -> dict[str, Any]:
        row = real(self, epoch)
        if epoch == 1:
            _poison(self.model)
        return row

    monkeypatch.setattr(PretrainRecipe, "train_epoch", diverging)
    with pytest.raises(SimgraphError) as e:
        run_pretraining(cfg, echo=False)
    message = str(e.value)
    assert "\n" not in message
    assert "not finite" in message and "encoder." in message  # what diverged
    good = run_dir / "epoch_00001"
    assert f"{good}" in message  # the checkpoint to go back to, by its path
    assert "optim.lr" in message and "train.grad_clip" in message  # what to change
    assert _epochs(run_dir) == ["epoch_00001"] and is_complete(good)
    assert read_meta(good)["finite"] is True
    assert not list(run_dir.glob(".epoch_*"))  # no hidden partial copy either

    monkeypatch.setattr(PretrainRecipe, "train_epoch", real)  # the cause gone: a re-run
    capsys.readouterr()
    history = run_pretraining(cfg, echo=False)
    assert "resumed 'run' after epoch 1" in capsys.readouterr().out
    assert [row["epoch"] for row in history] == [1, 2, 3]
    assert _epochs(run_dir) == ["epoch_00003"]


def test_a_non_finite_loss_names_the_good_checkpoint_and_a_lower_lr_resumes_from_it(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loss check's stop (weights NaN mid-epoch 2) names epoch 1's checkpoint; the re-run
    with the lower optim.lr it suggests resumes there, at the LR a run started with that
    optim.lr has at the same step."""
    cfg = _config(data, tmp_path / "runs")
    run_dir = tmp_path / "runs" / "run"
    real = training.train_step

    def step(model: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        out = real(model, *args, **kwargs)
        if kwargs["step"] == 2:  # global step 3: epoch 2's first; step 4's loss is NaN
            _poison(model)
        return out

    monkeypatch.setattr(training, "train_step", step)
    with pytest.raises(training.NonFiniteLossError) as e:
        run_pretraining(cfg, echo=False)
    message = str(e.value)
    assert "epoch 2 step 2/2" in message and "\n" not in message
    assert "checkpoint is intact" not in message  # the old claim, now a path:
    assert f"{run_dir / 'epoch_00001'}" in message
    assert f"optim.lr (now {cfg.optim.lr:g})" in message
    assert _epochs(run_dir) == ["epoch_00001"]

    monkeypatch.setattr(training, "train_step", real)
    lower = _config(data, tmp_path / "runs", optim__lr=cfg.optim.lr / 4)
    resumed = run_pretraining(lower, echo=False)  # accepted: optim.lr may change on a resume
    fresh = run_pretraining(_config(data, tmp_path / "runs", name="fresh",
                                    optim__lr=cfg.optim.lr / 4), echo=False)
    assert [r["epoch"] for r in resumed] == [1, 2, 3]
    assert resumed[1]["lr"] == pytest.approx(fresh[1]["lr"], rel=1e-12)
    assert resumed[2]["lr"] == pytest.approx(fresh[2]["lr"], rel=1e-12)
    assert resumed[0]["lr"] == pytest.approx(4 * fresh[0]["lr"], rel=1e-12)  # epoch 1: as run


def test_a_non_finite_state_is_refused_and_the_newest_finite_checkpoint_is_kept(
        tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    state = TrainingState(model=model.state_dict(), optimizer={}, scheduler={}, epoch=1,
                          step=2, history=[], config={})
    run_dir = tmp_path / "run"
    state.save(run_dir / "epoch_00001")
    assert read_meta(run_dir / "epoch_00001")["finite"] is True
    _poison(model)
    with pytest.raises(SimgraphError, match=r"not finite.*model\.weight"):
        TrainingState(model=model.state_dict(), optimizer={}, scheduler={}, epoch=2, step=4,
                      history=[], config={}).save(run_dir / "epoch_00002")
    assert _epochs(run_dir) == ["epoch_00001"]  # nothing written
    # A non-finite checkpoint that got there anyway (a plain save_state, an older version):
    save_state(run_dir / "epoch_00002", {"model": model.state_dict(), "epoch": 2})
    save_state(run_dir / "epoch_00003", {"model": model.state_dict(), "epoch": 3})
    assert read_meta(run_dir / "epoch_00003")["finite"] is False
    assert latest_complete(run_dir) == (1, str(run_dir / "epoch_00001"))  # resumed from
    assert prune_checkpoints(str(run_dir), 1) == ["epoch_00002"]
    assert _epochs(run_dir) == ["epoch_00001", "epoch_00003"]  # the newest finite one stays


def _enospc(path: Path) -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", str(path))


def test_a_full_disk_while_publishing_costs_one_line_and_nothing_else(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _config(data, tmp_path / "runs", train__epochs=2)
    run_dir = tmp_path / "runs" / "run"
    run_pretraining(_config(data, tmp_path / "runs", train__epochs=1), echo=False)
    before = (run_dir / "epoch_00001" / STATE).read_bytes()
    real = shutil.copyfile

    def full(src: Any, dst: Any, **kwargs: Any) -> Any:
        if Path(dst).name == STATE and ".epoch_00002" in str(dst):
            Path(dst).write_bytes(b"partial")
            raise _enospc(Path(dst))
        return real(src, dst, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", full)
    with pytest.raises(SimgraphError) as e:
        run_pretraining(cfg, echo=False)
    message = str(e.value)
    assert "\n" not in message
    assert "No space left" in message and str(run_dir) in message and STATE in message
    assert "free space" in message and "epoch_00001" in message
    assert not list(run_dir.glob(".epoch_*"))  # the partial copy removed
    assert _epochs(run_dir) == ["epoch_00001"]
    assert (run_dir / "epoch_00001" / STATE).read_bytes() == before

    monkeypatch.setattr(shutil, "copyfile", real)
    assert [r["epoch"] for r in run_pretraining(cfg, echo=False)] == [1, 2]


def test_a_full_disk_while_saving_the_state_costs_one_line_and_nothing_else(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _config(data, tmp_path / "runs", train__epochs=2)
    run_dir = tmp_path / "runs" / "run"
    run_pretraining(_config(data, tmp_path / "runs", train__epochs=1), echo=False)
    real = torch.save
    written: list[Path] = []

    def full(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        Path(f).write_bytes(b"partial")
        written.append(Path(f))
        raise _enospc(Path(f))

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(SimgraphError) as e:
        run_pretraining(cfg, echo=False)
    message = str(e.value)
    assert "\n" not in message and "No space left" in message
    assert str(written[0].parent / STATE) in message and "free space" in message
    assert not any(p.exists() for p in written)  # the partial file removed
    assert not written[0].parent.exists() or not any(written[0].parent.iterdir())
    assert _epochs(run_dir) == ["epoch_00001"] and is_complete(run_dir / "epoch_00001")

    monkeypatch.setattr(torch, "save", real)
    assert [r["epoch"] for r in run_pretraining(cfg, echo=False)] == [1, 2]



"""Resuming on another number of workers trains at the LR a run of the new shape has at the
same number of samples seen (issue 40, defect 3).

``scaling.*`` may change on a resume (spot nodes, a bigger allocation), but the restored
optimizer / scheduler state carried the old base LRs (``optim.lr_scaling`` of the old global
batch) and a position counted in the old shape's steps: a 1 → 2 worker resume ran past the end
of the new (shorter) schedule, at LR 0; a 2 → 1 resume trained at twice the LR, early in the
warm-up. Now the schedule is re-placed on restore
(:func:`components.training.optim.continue_schedule`):
this run's base LRs, at the step a run of this shape reaches after the samples the checkpoint
has seen (:func:`components.training.optim.schedule_position`) — one mechanism with a changed
``optim.lr``. A resume whose samples lie past the end of the new shape's schedule is refused
before any step, naming what changed and what to do.

* unit: the re-placed schedule gives, step for step, the LRs of a fresh run of the new shape
  (every optimizer, schedule and ``optim.lr_scaling``);
* end to end, CPU: 1 → 2 workers (the resumed leg on Ray Train) and back 2 → 1 (in-process),
  each compared step for step with a fresh run of the new shape (4 epochs, warm-up 3 epochs:
  the resumed epochs are in the warm-up and in the cosine; the fresh 2-worker run's LRs from
  the schedule a worker builds, checked against a real run's);
* a resume past the new schedule's end is refused before anything trains.

The 2-worker runs need Ray Train: run this file inside
``unshare -n bash -c 'ip link set lo up && HF_HUB_OFFLINE=1 .venv/bin/python -m pytest …'``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from components.config import OptimConfig, PretrainConfig, from_dict
from components.runs.checkpoint import TrainingState
from components.runs.checkpoints import latest_complete
from components.runs.errors import RunError
from components.runs.recipe import run_pretraining
from components.training import step as training
from tests.support.datasets import synthetic_dataset, tiny_run_config
from tests.support.procs import kill_session

ROOT = Path(__file__).resolve().parents[2]
EPOCHS, RESUME_AT = 4, 2
ONE = {"num_workers": 1, "cpus_per_worker": 1.0, "host": "in_process"}
TWO = {"num_workers": 2, "cpus_per_worker": 0.5, "host": "ray_train"}


# ------------------------------------------------------------------------------- the mechanism


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))


def _lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    return [float(g["lr"]) for g in optimizer.param_groups]


@pytest.mark.parametrize(("name", "schedule", "scaling"), [
    ("lars", "cosine", "linear"), ("sgd", "step", "sqrt"), ("adamw", "constant", "none"),
    ("lars", "cosine", "sqrt"),
])
@pytest.mark.parametrize(("old_world", "new_world", "new_lr"), [
    (1, 2, None), (2, 1, None), (1, 8, None), (8, 1, None), (2, 4, 0.05), (2, 2, 0.05),
])
def test_a_restored_schedule_continues_as_a_fresh_run_of_the_new_shape(
        name: str, schedule: str, scaling: str, old_world: int, new_world: int,
        new_lr: float | None) -> None:
    """Train the old shape to half its samples; restore its optimizer and scheduler state
    into the new shape's and re-place it: every later step's LR (every group) is the fresh
    new-shape run's at the same samples seen, exactly (and the state dicts match)."""
    from components.training.optim import build_for_run, continue_schedule, schedule_position

    batch, samples_per_epoch, epochs = 16, 256, 8
    old = OptimConfig(name=name, lr=0.2, schedule=schedule, lr_scaling=scaling,
                      warmup_epochs=3, step_epochs=(5, 7) if schedule == "step" else ())
    new = old if new_lr is None else OptimConfig(**{**old.__dict__, "lr": new_lr})

    def shape(cfg: OptimConfig, world: int) -> tuple[Any, Any, int]:
        spe = samples_per_epoch // (batch * world)
        opt, sched = build_for_run(_model(), cfg, batch * world, spe, epochs)
        return opt, sched, spe

    opt_a, sched_a, spe_a = shape(old, old_world)
    for _ in range(spe_a * 4):  # 4 of 8 epochs
        opt_a.step()
        sched_a.step()
    samples = spe_a * 4 * batch * old_world

    opt_b, sched_b, spe_b = shape(new, new_world)
    fresh_base = list(sched_b.base_lrs)
    opt_b.load_state_dict(opt_a.state_dict())
    sched_b.load_state_dict(sched_a.state_dict())
    step = schedule_position(samples, batch * new_world)
    assert step == spe_b * 4
    continue_schedule(opt_b, sched_b, fresh_base, step)

    opt_f, sched_f, _ = shape(new, new_world)  # the fresh run of the new shape
    seen: list[list[float]] = []
    for s in range(spe_b * epochs):
        if s >= step:
            assert _lrs(opt_b) == _lrs(opt_f), f"step {s}"
            seen.append(_lrs(opt_b))
            opt_b.step()
            sched_b.step()
        opt_f.step()
        sched_f.step()
    assert len(seen) == spe_b * 4
    b, f = sched_b.state_dict(), sched_f.state_dict()
    assert [b[k] for k in ("base_lrs", "last_epoch", "_last_lr")] == [
        f[k] for k in ("base_lrs", "last_epoch", "_last_lr")]
    for a, b in zip(opt_b.state_dict()["param_groups"], opt_f.state_dict()["param_groups"],
                    strict=True):
        assert a["lr"] == b["lr"] and a["initial_lr"] == b["initial_lr"]


def test_schedule_position_counts_samples_in_steps_of_the_new_shape() -> None:
    from components.training.optim import schedule_position

    assert schedule_position(256, 32) == 8
    assert schedule_position(256, 16) == 16
    assert schedule_position(0, 64) == 0
    assert schedule_position(100, 48) == 2  # the nearest step: 2.08
    with pytest.raises(ValueError, match="global_batch"):
        schedule_position(10, 0)
    with pytest.raises(ValueError, match="samples"):
        schedule_position(-1, 16)


# ------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 128 training images, batch 16: 8 steps per epoch on 1 worker, 4 on 2
    return synthetic_dataset(tmp_path_factory.mktemp("elastic") / "ds")


def _cfg(data: Path, storage: Path, scaling: dict[str, Any], **over: Any) -> dict[str, Any]:
    return tiny_run_config(data, storage, name="run", scaling=dict(scaling), knn__every_epochs=0,
                           **{"train__epochs": EPOCHS, "train__log_every_steps": 1,
                              "optim__warmup_epochs": 3, "checkpoint__keep": EPOCHS, **over})


class _Steps:
    """The LR of every optimiser step an in-process run takes, by global step (1-based)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lr: dict[int, float] = {}
        real = training.train_step

        def step(*args: Any, **kwargs: Any) -> dict[str, Any]:
            out = real(*args, **kwargs)
            self.lr[kwargs["step"] + 1] = out["lr"]
            return out

        monkeypatch.setattr(training, "train_step", step)


def _in_process(cfg: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[int, float]:
    with monkeypatch.context() as m:
        steps = _Steps(m)
        run_pretraining(from_dict(PretrainConfig, cfg), echo=False)
    return steps.lr


_STEP_LINE = re.compile(r"\[simgraph\] epoch (\d+) step (\d+)/(\d+) loss \S+ lr (\S+)")


def _on_ray(cfg: dict[str, Any], tmp: Path, tag: str) -> tuple[dict[int, str], str]:
    """``simgraph pretrain`` in a subprocess (Ray Train, 2 workers); (the LR of every step as
    rank 0 printed it (``train.log_every_steps: 1``), by global step; the log)."""
    path = tmp / f"{tag}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = tmp / f"{tag}.log"
    env = {k: v for k, v in os.environ.items() if k != "SIMGRAPH_VERBOSE"}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "pretrain", str(path)],
                                cwd=ROOT, env=env, start_new_session=True, stdout=out,
                                stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=400)
        finally:
            kill_session(proc.pid)
    text = log.read_text()
    assert rc == 0, text[-4000:]
    lrs: dict[int, str] = {}
    for m in _STEP_LINE.finditer(text):
        epoch, i, n = int(m[1]), int(m[2]), int(m[3])
        lrs[(epoch - 1) * n + i] = m[4]
    return lrs, text


def _cut(run_dir: Path, dest_storage: Path, epochs: int) -> None:
    """``run_dir`` copied to ``dest_storage/run`` without its checkpoints after ``epochs``
    (what a run stopped there leaves; Ray Train's own records dropped)."""
    dest = dest_storage / "run"
    shutil.copytree(run_dir, dest)
    for p in dest.iterdir():
        if p.name.startswith("epoch_") and int(p.name.split("_")[1]) > epochs:
            shutil.rmtree(p)
        elif p.name.startswith(("checkpoint_manager", ".validate")) and p.is_file():
            p.unlink()
    assert latest_complete(dest)[0] == epochs  # type: ignore[index]


def _state(run_dir: Path) -> TrainingState:
    found = latest_complete(run_dir)
    assert found is not None
    return TrainingState.load(found[1])


def _same_schedule(a: TrainingState, b: TrainingState, resumed_at: int) -> None:
    """``a`` (resumed after epoch ``resumed_at`` on ``b``'s shape) ends with ``b``'s schedule,
    optimizer LRs and per-epoch LRs of the epochs it trained at that shape."""
    assert a.epoch == b.epoch == EPOCHS and a.step == b.step
    assert a.scheduler["last_epoch"] == b.scheduler["last_epoch"]
    assert a.scheduler["base_lrs"] == b.scheduler["base_lrs"]
    assert a.scheduler["_last_lr"] == b.scheduler["_last_lr"]
    for ga, gb in zip(a.optimizer["param_groups"], b.optimizer["param_groups"], strict=True):
        assert ga["lr"] == gb["lr"] and ga["initial_lr"] == gb["initial_lr"]
    assert [r["lr"] for r in a.history[resumed_at:]] == [r["lr"] for r in b.history[resumed_at:]]


TRAIN_IMAGES = 128  # the synthetic dataset's train split


def _fresh_lrs(cfg: dict[str, Any]) -> dict[int, str]:
    """The LR of every step of a fresh run of ``cfg``, as rank 0 prints it (``lr {:.6g}``),
    without running it: the optimiser and schedule a worker assembles
    (:func:`components.training.optim.build_for_run` at the run's global batch and steps per
    epoch, ``drop_last``), stepped. Checked against a real run in the test."""
    from components.training.optim import build_for_run

    c = from_dict(PretrainConfig, cfg)
    world, batch = c.scaling.num_workers, c.data.batch_size
    steps = TRAIN_IMAGES // (batch * world)
    opt, sched = build_for_run(_model(), c.optim, batch * world, steps, c.train.epochs)
    lrs = {}
    for s in range(1, steps * c.train.epochs + 1):
        lrs[s] = f"{opt.param_groups[0]['lr']:.6g}"
        opt.step()
        sched.step()
    return lrs


@pytest.mark.slow
def test_resume_one_to_two_workers_and_two_to_one_train_at_the_new_shapes_lr(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh 1-worker run (in-process) of 4 epochs; its checkpoint after epoch 2 resumed on
    2 workers (Ray Train): the resumed epochs' LR at every step is a fresh 2-worker run's at
    the same samples seen (step 17 of 1 worker = step 9 of 2: 256 samples); that run's
    checkpoint after epoch 3 (2 workers, 384 samples) resumed on 1 worker: steps 25-32 at the
    fresh 1-worker run's LRs, and the final schedule and optimizer LRs are the fresh run's.
    A fresh 2-worker run's LRs are the schedule a worker builds (:func:`_fresh_lrs`), which
    must give the real 1-worker run's, printed the same way."""
    one = _in_process(_cfg(data, tmp_path / "one", ONE), monkeypatch)
    assert sorted(one) == list(range(1, 33))
    assert {s: f"{lr:.6g}" for s, lr in one.items()} == _fresh_lrs(
        _cfg(data, tmp_path / "one", ONE))
    two = _fresh_lrs(_cfg(data, tmp_path / "two", TWO))
    assert sorted(two) == list(range(1, 17))

    # 1 -> 2: the 1-worker run's epoch-2 checkpoint (16 steps, 256 samples) on 2 workers
    _cut(tmp_path / "one" / "run", tmp_path / "one_to_two", RESUME_AT)
    lrs, log = _on_ray(_cfg(data, tmp_path / "one_to_two", TWO), tmp_path, "one_to_two")
    assert "resumed 'run' after epoch 2" in log
    assert "scaling.num_workers 1 -> 2" in log  # says what changed and what it did
    assert sorted(lrs) == list(range(9, 17))
    for s in lrs:
        assert lrs[s] == two[s], f"step {s}: resumed {lrs[s]} vs fresh {two[s]}"
    end = _state(tmp_path / "one_to_two" / "run")
    assert end.epoch == EPOCHS and end.step == 16 and end.scheduler["last_epoch"] == 16

    # 2 -> 1: that 2-worker run's epoch-3 checkpoint (12 steps, 384 samples) on 1 worker
    _cut(tmp_path / "one_to_two" / "run", tmp_path / "two_to_one", RESUME_AT + 1)
    resumed = _in_process(_cfg(data, tmp_path / "two_to_one", ONE), monkeypatch)
    assert sorted(resumed) == list(range(25, 33))  # continued at the 1-worker step of 384
    for s in resumed:
        assert resumed[s] == one[s], f"step {s}: resumed {resumed[s]} vs fresh {one[s]}"
    _same_schedule(_state(tmp_path / "two_to_one" / "run"), _state(tmp_path / "one" / "run"),
                   RESUME_AT + 1)


@pytest.mark.parametrize("record", ["meta", "state"])
def test_a_resume_past_the_new_shapes_schedule_is_refused_before_any_step(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record: str) -> None:
    """``train.steps_per_epoch`` caps an epoch in steps, so 2 → 1 workers halves the samples
    of an epoch: a checkpoint after 3 of 4 epochs on 2 workers (192 samples) is past the end
    of the 1-worker run's whole schedule (4 × 2 × 16 = 128). The resume is refused before any
    step, naming the change and what to do; nothing is written. ``meta``: by the driver, from
    ``meta.json``; ``state``: a checkpoint whose ``meta.json`` predates the record, by the
    recipe from ``state.pt``."""
    cfg = _cfg(data, tmp_path / "runs", ONE, train__steps_per_epoch=2)
    _in_process({**cfg, "train": {**cfg["train"], "epochs": 3}}, monkeypatch)
    run_dir = tmp_path / "runs" / "run"
    # What a 2-worker run leaves after 3 epochs: its config, 3 × 2 steps of 32 samples
    found = latest_complete(run_dir)
    assert found is not None and found[0] == 3
    state = TrainingState.load(found[1])
    state.config["scaling"] = {**state.config["scaling"], "num_workers": 2}
    state.step, state.samples = 6, 192
    state.save(found[1])
    meta = json.loads((Path(found[1]) / "meta.json").read_text())
    assert meta["samples"] == 192 and meta["shape"]["scaling.num_workers"] == 2
    if record == "state":
        del meta["samples"], meta["shape"]
        (Path(found[1]) / "meta.json").write_text(json.dumps(meta))
    with monkeypatch.context() as m:
        steps = _Steps(m)
        with pytest.raises(RunError) as e:
            run_pretraining(from_dict(PretrainConfig, cfg), echo=False)
    message = str(e.value)
    assert steps.lr == {}  # refused before any step
    assert "scaling.num_workers 2 -> 1" in message and "192 samples" in message
    assert "scaling.num_workers=2" in message  # how to proceed
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith("epoch_")) == [
        "epoch_00001", "epoch_00002", "epoch_00003"]

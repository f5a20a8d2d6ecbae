"""Real SIGKILLs (``kill -9``: no ``finally``, no ``atexit``) at the points where a run's
files change, each in a child process, then the resume in this one: the fault matrix cells of
docs/reliability.md that an exception cannot stand in for. No Ray: the one-worker host
(:class:`~components.runs.hosts.TuneTrial`) writes the same run dir layout a Ray Train run does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from components.config import PretrainConfig, from_dict
from components.runs.checkpoint import TrainingState, is_complete, save_state
from components.runs.checkpoints import latest_complete
from components.runs.hosts import TuneTrial
from components.runs.recipe import loop_config
from components.runs.run_dir import prepare_run
from components.runs.worker import PretrainRecipe
from tests.support.datasets import synthetic_dataset, tiny_run_config

ROOT = Path(__file__).parents[2]

# Publish epoch 3 into a run dir holding epochs 1-2 (keep 2), as an in-trial sweep trial
# does, SIGKILLed at the n-th call of argv[3] (a function of components.runs.checkpoints).
KILL_PUBLISH = """
import os, signal, sys
from components.runs import checkpoints
from components.io import storage
from components.runs.hosts import TuneTrial
where, n = sys.argv[3], int(sys.argv[4])
owner = storage if where == "delete_dir" else checkpoints
real, calls = getattr(owner, where), [0]
def killing(*a, **k):
    calls[0] += 1
    if calls[0] == n:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*a, **k)
setattr(owner, where, killing)
class Host(TuneTrial):
    def send(self, result):
        pass
Host(sys.argv[1], 2, "loss").report({"epoch": 3, "loss": 1.0}, sys.argv[2], 3)
"""


def _state(epoch: int) -> dict[str, Any]:
    return {"epoch": epoch, "step": 4 * epoch, "w": torch.full((1000,), float(epoch))}


@pytest.mark.parametrize("where,n,newest", [
    ("_fsync", 1, 2),  # copied, nothing flushed or renamed yet
    ("_fsync", 3, 2),  # every file flushed, the rename not done
    ("_fsync", 4, 3),  # renamed into place, the directory entry not yet flushed
    ("delete_dir", 1, 3),  # pruning epoch 1 (epoch 3 verified)
])
def test_sigkill_while_a_checkpoint_is_published(tmp_path: Path, where: str, n: int,
                                                 newest: int) -> None:
    run_dir = tmp_path / "run"
    for epoch in (1, 2):
        save_state(run_dir / f"epoch_{epoch:05d}", _state(epoch))
    staged = save_state(tmp_path / "staged", _state(3))
    proc = subprocess.run([sys.executable, "-c", KILL_PUBLISH, str(run_dir), str(staged),
                           where, str(n)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # The resume finds a complete checkpoint: the old newest, or the new one once renamed.
    done = latest_complete(run_dir)
    assert done is not None and done[0] == newest and is_complete(done[1])
    # The resumed trial redoes epoch 3 (or, past it, the next one) and publishes again: the
    # killed copy's temporary is cleared, the older checkpoints pruned to `keep`.
    TuneTrialQuiet(str(run_dir), 2).report({"epoch": 3, "loss": 1.0}, str(staged), 3)
    assert sorted(p.name for p in run_dir.iterdir()) == ["epoch_00002", "epoch_00003"]


class TuneTrialQuiet(TuneTrial):
    def __init__(self, run_dir: str, keep: int | None) -> None:
        super().__init__(run_dir, keep, "loss")

    def send(self, result: dict[str, Any]) -> None:
        pass


# One-worker pretraining in this child process, paused at a global step (the recipe's
# PAUSE_ENV fault injection) so the parent can SIGKILL it there.
TRAIN = """
import json, sys
from components.config import PretrainConfig, from_dict
from components.runs.recipe import loop_config
from components.runs.worker import PretrainRecipe
from components.runs.run_dir import prepare_run
from components.runs.hosts import TuneTrial
class Host(TuneTrial):
    def send(self, result):
        pass
run = prepare_run(from_dict(PretrainConfig, json.loads(sys.argv[1])))
PretrainRecipe(loop_config(run.cfg, run.run_dir, run.facts, pause_at_step=int(sys.argv[2])),
               host=Host(run.run_dir, run.cfg.checkpoint.keep, "loss")).run()
"""


def _train_here(cfg: PretrainConfig) -> TrainingState:
    run = prepare_run(cfg)
    PretrainRecipe(loop_config(run.cfg, run.run_dir, run.facts, pause_at_step=0),
                   host=TuneTrialQuiet(run.run_dir, run.cfg.checkpoint.keep)).run()
    done = latest_complete(run.run_dir)
    assert done is not None
    return TrainingState.load(done[1])


def test_sigkilled_in_trial_run_resumes_to_identical_weights(tmp_path: Path) -> None:
    """An in-trial sweep trial (the Tune actor trains in its own process) SIGKILLed mid-epoch
    2: the epoch in progress is lost, the resume starts after epoch 1 and ends with the
    weights, optimiser state and history of an uninterrupted run."""
    import json

    data = synthetic_dataset(tmp_path / "ds", size=16)

    def config(storage: str) -> dict[str, Any]:
        return tiny_run_config(data, tmp_path / storage, train__epochs=3,
                               knn__every_epochs=0,
                               scaling={"num_workers": 1, "cpus_per_worker": 1.0})

    full = _train_here(from_dict(PretrainConfig, config("a")))
    steps_per_epoch = full.step // 3
    assert steps_per_epoch >= 3
    pause = steps_per_epoch + 2  # inside epoch 2
    child = subprocess.Popen([sys.executable, "-c", TRAIN, json.dumps(config("b")),
                              str(pause)], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    run_dir = tmp_path / "b" / "run"
    flag = run_dir / "workers" / f"paused-rank0-step{pause}"
    deadline = time.monotonic() + 240
    while not flag.exists():
        assert child.poll() is None, child.communicate()[1]
        assert time.monotonic() < deadline, "the child never reached the pause"
        time.sleep(0.2)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    assert latest_complete(run_dir) == (1, str(run_dir / "epoch_00001"))

    resumed = _train_here(from_dict(PretrainConfig, config("b")))
    assert (resumed.epoch, resumed.step) == (3, full.step)
    for key, tensor in full.model.items():
        assert torch.equal(tensor, resumed.model[key]), key
    for a, b in zip(full.optimizer["state"].values(), resumed.optimizer["state"].values(),
                    strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a if torch.is_tensor(a[k]))
    timing = {"samples_per_s", "data_wait", "time_s", "eval_s"}
    assert [{k: v for k, v in r.items() if k not in timing} for r in resumed.history] == \
        [{k: v for k, v in r.items() if k not in timing} for r in full.history]

"""One writer per directory (issue 39, found-item 2 and principle 2): run dirs (``simgraph
pretrain``), sweep dirs (``simgraph sweep``, ``--resume``) and dataset dirs (``simgraph
preprocess``) are locked while written. The lock names its owner (host, pid, start time); a
second writer is refused in one line naming it, and nothing of the first's is touched; a lock
whose owner is dead (pid gone, or reused by a process that started at another time) is taken
over, saying so. Two runs started together with different configs cannot both pass the config
check. Every writer of a run dir goes through one library function
(``components.runs.run_dir.writing_run``): ``simgraph pretrain``, ``simgraph run``, each sweep trial
and confirmation run. A run that reads a dataset refuses it when a rebuild was swapped in since
it started (checked before the training loader — at every worker start, restart or resume —
and the kNN loaders open the split files).

The second writer is a real process: a subprocess holding the lock (``holding`` below), a lock
file naming a live process, or two ``simgraph pretrain`` commands started at once. No Ray:
training runs in-process (``scaling.host=in_process``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.io.files import LockHeld, holding, process_start, read_lock
from pipelines.cli import main
from tests.support.datasets import run_with_checkpoint, synthetic_dataset, tiny_run_config
from tests.support.helpers import one_line_error as _one_line
from tests.support.helpers import tree_digests as _tree

ROOT = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()

# A second process that takes a lock and keeps it until its stdin closes.
_HOLD = """
import sys
from components.io import storage
from components.io.files import holding
kind, target = sys.argv[1], sys.argv[2]
lock = (holding(target, "test") if kind == "file" else
        storage.writer_lock(target, "test", error=RuntimeError, refusal=""))
with lock:
    print("held", flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def holder(target: Path | str, kind: str = "file") -> Iterator[subprocess.Popen[str]]:
    """A live process holding the lock ``target`` (``kind`` ``file``: the lock file itself;
    ``dir``: a run or sweep dir's writer lock) until the block ends."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, kind, str(target)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _free(lock: Path) -> bool:
    """Whether nobody holds ``lock``'s flock (taken and given back at once)."""
    import fcntl

    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True




# ---------------------------------------------------------------------------------------------
# The lock itself (components/io/files.py: holding).


def test_a_lock_held_by_a_live_process_is_refused_naming_it(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    with holder(lock) as proc:
        with pytest.raises(LockHeld) as e, holding(lock, "the test dir", refusal="wait"):
            pass
        msg = str(e.value)
        assert f"the test dir is held by pid {proc.pid} on {HOST} since " in msg
        assert msg.endswith(": wait") and len(msg.splitlines()) == 1
        assert read_lock(lock)["pid"] == proc.pid  # the holder's record is untouched
    with holding(lock, "the test dir") as took_over:  # released: free, nothing to take over
        assert took_over is None and read_lock(lock)["pid"] == os.getpid()
    assert read_lock(lock) is None  # emptied on release


def test_a_lock_file_naming_a_live_process_is_held(tmp_path: Path) -> None:
    """The lock file was replaced under its live holder (no flock on this copy): still held."""
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        lock = tmp_path / "x.lock"
        lock.write_text(json.dumps({"host": HOST, "pid": sleeper.pid, "started": "then",
                                    "process_start": process_start(sleeper.pid)}))
        with pytest.raises(LockHeld, match=f"held by pid {sleeper.pid} on {HOST} since then"):
            with holding(lock, "the test dir"):
                pass
        assert read_lock(lock)["pid"] == sleeper.pid
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_dead_owners_lock_is_taken_over_saying_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lock = tmp_path / "x.lock"
    dead = {"host": HOST, "pid": _dead_pid(), "started": "2026-11-26T10:00:00",
            "process_start": "1"}
    lock.write_text(json.dumps(dead))
    with holding(lock, "the test dir") as took_over:
        assert took_over == dead
        assert read_lock(lock)["pid"] == os.getpid()
    err = capsys.readouterr().err
    assert (f"taking over the test dir from pid {dead['pid']} on {HOST} since "
            "2026-11-26T10:00:00 (that process is no longer running)") in err


def test_a_killed_holder_not_yet_reaped_is_dead(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """SIGKILL of the holder (a test's or a supervisor's child, not reaped yet: a zombie whose
    pid still answers ``kill(pid, 0)``): its lock is taken over at once."""
    lock = tmp_path / "x.lock"
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, "file", str(lock)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        proc.kill()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        while not _free(lock):  # the kernel drops the flock once the last thread has exited
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with holding(lock, "the test dir") as took_over:
            assert took_over is not None and took_over["pid"] == proc.pid
        assert f"from pid {proc.pid} on {HOST}" in capsys.readouterr().err
    finally:
        proc.wait(timeout=30)


def test_a_reused_pid_is_not_the_owner(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The recorded pid runs, but it is another process (it started at another time)."""
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        lock = tmp_path / "x.lock"
        lock.write_text(json.dumps({"host": HOST, "pid": sleeper.pid, "started": "then",
                                    "process_start": "1"}))  # not the sleeper's start time
        with holding(lock, "the test dir"):
            assert read_lock(lock)["pid"] == os.getpid()
        assert "no longer running" in capsys.readouterr().err
    finally:
        sleeper.kill()
        sleeper.wait()


# ---------------------------------------------------------------------------------------------
# simgraph pretrain: one writer per run dir.


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_dataset(tmp_path_factory.mktemp("ow") / "ds", size=16,
                             train_per_class=8, val_per_class=2, seed=0)


def _cfg_file(tmp: Path, data: Path, storage: Path, file: str = "run.yaml",
              **over: Any) -> Path:
    cfg = tiny_run_config(data, storage, name="run", knn__every_epochs=0,
                          scaling={"num_workers": 1, "cpus_per_worker": 1.0,
                                   "host": "in_process"},
                          **{"train__epochs": 1, **over})
    path = tmp / file
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_second_pretrain_on_a_live_run_is_refused_and_its_checkpoints_survive(
        data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = tmp_path / "runs"
    run_dir = run_with_checkpoint(data, storage, "run")  # the first run, mid-training
    before = _tree(run_dir)
    cfg = _cfg_file(tmp_path, data, storage, train__epochs=3)
    with holder(run_dir, "dir") as first:
        capsys.readouterr()
        assert main(["pretrain", str(cfg)]) == 1
        err = _one_line(capsys)
    assert f"the run dir {run_dir} is held by pid {first.pid} on {HOST} since " in err
    assert "another simgraph pretrain, run or sweep trial is training this run" in err
    assert _tree(run_dir) == before  # no checkpoint pruned, no config or worker record


def test_simgraph_run_on_a_live_run_is_refused_and_its_checkpoints_survive(
        data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``simgraph run`` calls the recipe's driver as ``simgraph pretrain`` does, so it takes
    the same lock: a run of its plan that another process is training is refused in one line
    naming it, the run dir byte-identical. (Its dataset step and Ray session are stubbed out:
    the dataset is built, the run trains in-process.)"""
    import components.data.build
    import components.runtime.session

    storage = tmp_path / "runs"
    run_dir = run_with_checkpoint(data, storage, "run-a")  # the live run, mid-training
    before = _tree(run_dir)
    (tmp_path / "pre.yaml").write_text(yaml.safe_dump({
        "output": str(data), "source": {"kind": "folder", "path": str(tmp_path / "src")},
        "captions": {"enabled": False}}))
    _cfg_file(tmp_path, data, storage, "base.yaml", train__epochs=3)
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump({
        "preprocess": "pre.yaml", "pretrain": "base.yaml", "prefix": "run", "runs": {"a": []}}))
    monkeypatch.setattr(components.data.build, "run", lambda pre, echo=True: None)
    monkeypatch.setattr(components.runtime.session, "ray_session",
                        lambda *a, **k: contextlib.nullcontext())
    with holder(run_dir, "dir") as first:
        capsys.readouterr()
        assert main(["run", str(tmp_path / "plan.yaml")]) == 1
        err = _one_line(capsys)
    assert err.startswith(f"simgraph run: the run dir {run_dir} is held by pid {first.pid} "
                          f"on {HOST} since "), err
    assert "another simgraph pretrain, run or sweep trial is training this run" in err
    assert _tree(run_dir) == before


def test_every_run_dir_is_prepared_under_its_writer_lock() -> None:
    """The class of the gap ``simgraph run`` had (it called the recipe's driver, which took no
    lock): a run dir is prepared — ``config.yaml`` read and written, the dataset checked, the
    resume decided — only inside ``components.runs.run_dir.writing_run``, which holds its lock and
    claims it, and every command that trains the recipe gets its run dir from there."""
    import ast

    prepares, writers = [], set()
    for path in sorted([*(ROOT / "components").rglob("*.py"), *(ROOT / "pipelines").rglob("*.py")]):
        rel = str(path.relative_to(ROOT))
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if name in ("prepare_run", "prepare_run_dir"):
                    prepares.append((rel, fn.name, name))
                elif name == "writing_run":
                    writers.add((rel, fn.name))
    assert {(r, f) for r, f, _ in prepares} <= {("components/runs/run_dir.py", "writing_run"),
                                               ("components/runs/run_dir.py", "prepare_run")}, \
        prepares
    assert {("components/runs/recipe.py", "run_pretraining"),
            ("components/sweep/tuner.py", "trial_fn"),
            ("components/sweep/confirm_runs.py", "confirm_fn")} <= writers, writers


def test_a_stale_run_lock_is_taken_over(data: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    storage = tmp_path / "runs"
    storage.mkdir()
    dead = _dead_pid()
    (storage / ".run.lock").write_text(json.dumps(
        {"host": HOST, "pid": dead, "started": "2026-11-26T10:00:00", "process_start": "1"}))
    assert main(["pretrain", str(_cfg_file(tmp_path, data, storage))]) == 0
    err = capsys.readouterr().err
    assert (f"taking over the run dir {storage / 'run'} from pid {dead} on {HOST}" in err
            and "no longer running" in err)
    assert (storage / "run" / "epoch_00001" / "meta.json").exists()
    assert read_lock(storage / ".run.lock") is None  # released when the run ended


def test_two_runs_started_together_with_different_configs_do_not_both_pass(
        data: Path, tmp_path: Path) -> None:
    """Two real ``simgraph pretrain`` commands of one run name, started at the same moment
    with different configs: one trains, the other is refused (the lock, or — if the first
    has finished — the config check); ``config.yaml`` is the one that trained."""
    storage = tmp_path / "runs"
    files = [_cfg_file(tmp_path, data, storage, f"{tau}.yaml", loss__tau=tau)
             for tau in (0.2, 0.3)]
    code = "import sys; from pipelines.cli import main; sys.exit(main(sys.argv[1:]))"
    procs = [subprocess.Popen([sys.executable, "-c", code, "pretrain", str(f)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for f in files]
    done = [p.communicate(timeout=300) for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 1], done
    winner, loser = codes.index(0), codes.index(1)
    err = done[loser][1]
    assert ("is held by pid" in err and "another simgraph pretrain" in err) or (
        "was started with a different config" in err and "loss.tau" in err), err
    stored = yaml.safe_load((storage / "run" / "config.yaml").read_text())
    assert stored["loss"]["tau"] == (0.2, 0.3)[winner]
    assert (storage / "run" / "epoch_00001" / "meta.json").exists()


# ---------------------------------------------------------------------------------------------
# simgraph sweep: one writer per sweep dir.


def _space(tmp: Path, data: Path, epochs: int = 1) -> Path:
    base = tiny_run_config(data, Path("unused"), name="base", train__epochs=epochs,
                           scaling={"num_workers": 1, "cpus_per_worker": 1.0},
                           loss={"name": "simclr", "tau": 0.2})
    (tmp / "base.yaml").write_text(yaml.safe_dump(base))
    space = {"name": "s", "storage": str(tmp / "sweeps"), "base": str(tmp / "base.yaml"),
             "metric": "knn_top1", "mode": "max", "num_samples": 2, "max_concurrent": 1,
             "resources": {"workers": 1, "cpus_per_worker": 1.0, "gpus_per_worker": 0.0},
             "searcher": {"name": "random", "seed": 0}, "scheduler": {"name": "fifo"},
             "space": {"optim.lr": {"loguniform": [0.01, 0.5]}}}
    path = tmp / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


@pytest.mark.parametrize("resume", [False, True])
def test_a_sweep_beside_a_live_sweep_is_refused(
        data: Path, tmp_path: Path, resume: bool, capsys: pytest.CaptureFixture[str]) -> None:
    space = _space(tmp_path, data)
    sweep_dir = tmp_path / "sweeps" / "s"
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "experiment_state.json").write_text("{}")  # the live sweep's state
    before = _tree(sweep_dir)
    with holder(sweep_dir, "dir") as first:
        capsys.readouterr()
        assert main(["sweep", str(space), *(["--resume"] if resume else [])]) == 1
        err = _one_line(capsys)
    assert f"the sweep dir {sweep_dir} is held by pid {first.pid} on {HOST}" in err
    assert "another simgraph sweep is writing it" in err
    assert _tree(sweep_dir) == before


# A sweep trial: its run dir has one writer too (the trial's process holds its lock).

TRIAL = "t0001"


def _trial(space: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch,
           on_report: Any) -> None:
    """``components.sweep.tuner.trial_fn`` as a Tune trial actor runs it (one worker: it trains in
    this process), with Tune's trial id and ``report`` given here (``on_report(result)``)."""
    import types

    from ray import tune

    from components.sweep.tuner import trial_fn

    monkeypatch.setattr(tune, "get_context",
                        lambda: types.SimpleNamespace(get_trial_id=lambda: TRIAL))
    monkeypatch.setattr(tune, "report", on_report)
    trial_fn({"optim.lr": 0.1}, str(space), [], str(tmp))


def test_a_pretrain_into_a_trial_the_sweep_trains_is_refused(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``simgraph pretrain storage=<sweep>/trials name=<trial>`` while the sweep trains that
    trial: refused in one line naming the trial's process; the trial's run dir byte-identical
    (its checkpoint, config, worker record); the lock is released when the trial ends."""
    trials = tmp_path / "sweeps" / "s" / "trials"
    trial_dir, lock = trials / TRIAL, trials / f".{TRIAL}.lock"
    cfg = tmp_path / "into-trial.yaml"
    cfg.write_text(yaml.safe_dump(tiny_run_config(
        data, trials, name=TRIAL, knn__every_epochs=0, train__epochs=3,
        scaling={"num_workers": 1, "cpus_per_worker": 1.0, "host": "in_process"})))
    seen: list[tuple[dict[str, str], subprocess.CompletedProcess[str], dict[str, str]]] = []

    def report(result: dict[str, Any]) -> None:  # epoch 1's checkpoint is in the run dir
        if not seen:
            before = _tree(trial_dir)
            code = "import sys; from pipelines.cli import main; sys.exit(main(sys.argv[1:]))"
            out = subprocess.run([sys.executable, "-c", code, "pretrain", str(cfg)], cwd=ROOT,
                                 capture_output=True, text=True, timeout=120)
            seen.append((before, out, _tree(trial_dir)))

    _trial(_space(tmp_path, data, epochs=2), tmp_path, monkeypatch, report)
    before, out, after = seen[0]
    err = out.stderr.strip()
    assert out.returncode == 1 and len(err.splitlines()) == 1, err
    assert (f"simgraph pretrain: the run dir {trial_dir} is held by pid {os.getpid()} on "
            f"{HOST} since ") in err
    assert "another simgraph pretrain, run or sweep trial is training this run" in err
    assert "epoch_00001/state.pt" in before and after == before
    assert (trial_dir / "epoch_00002" / "meta.json").exists()  # the trial went on to its end
    assert read_lock(lock) is None and _free(lock)  # released when the trial ended


def test_a_stopped_trial_releases_its_run_dir_and_its_restart_resumes(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tune stops a trial (ASHA, the end of the sweep, a reused actor's next trial) by
    ``sys.exit(0)`` inside its ``report`` (Ray 2.60's ``_TrainSession``): the trial's lock is
    released with it, and the trial run again (a restart after a failure, ``--resume``) takes
    it and resumes from the checkpoint the stopped one left."""
    space = _space(tmp_path, data, epochs=2)
    trials = tmp_path / "sweeps" / "s" / "trials"
    lock = trials / f".{TRIAL}.lock"

    def stop(result: dict[str, Any]) -> None:
        assert read_lock(lock)["pid"] == os.getpid()  # held while the trial trains
        sys.exit(0)

    with pytest.raises(SystemExit):
        _trial(space, tmp_path, monkeypatch, stop)
    assert read_lock(lock) is None and _free(lock)
    epochs: list[int] = []
    _trial(space, tmp_path, monkeypatch, lambda result: epochs.append(result["epoch"]))
    assert epochs == [2]  # resumed after epoch 1
    assert read_lock(lock) is None and _free(lock)


def test_a_trial_waits_for_its_run_dir_then_names_the_holder(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial whose run dir another process holds (a stopping trial's process not yet gone,
    or a ``simgraph pretrain`` pointed at it) waits, bounded, then fails in one line naming
    the holder; nothing is written into the trial's run dir."""
    from components.runs.errors import RunError
    from components.sweep import tuner

    space = _space(tmp_path, data)
    trial_dir = tmp_path / "sweeps" / "s" / "trials" / TRIAL
    monkeypatch.setattr(tuner, "TRIAL_LOCK_WAIT_S", 0.5)
    with holder(trial_dir, "dir") as first, pytest.raises(RunError) as e:
        _trial(space, tmp_path, monkeypatch, lambda result: None)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1, msg
    assert msg.startswith(f"gave up after 0.5 s waiting for the run dir {trial_dir}, held by "
                          f"pid {first.pid} on {HOST} since "), msg
    assert not trial_dir.exists()


# ---------------------------------------------------------------------------------------------
# simgraph preprocess: one writer per dataset dir; readers verify what they read.


def test_a_preprocess_beside_a_live_one_is_refused_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = synthetic_dataset(tmp_path / "ds", classes=2, train_per_class=4, val_per_class=2,
                            size=8)
    before = _tree(out)
    (tmp_path / "src" / "cat").mkdir(parents=True)
    cfg = tmp_path / "pre.yaml"
    cfg.write_text(yaml.safe_dump({"output": str(out),
                                   "source": {"kind": "folder", "path": str(tmp_path / "src")},
                                   "captions": {"enabled": False}}))
    with holder(out / ".lock") as first:
        capsys.readouterr()
        assert main(["preprocess", str(cfg), "--overwrite"]) == 1
        err = _one_line(capsys)
    assert f"the dataset dir {out} is held by pid {first.pid} on {HOST}" in err
    assert "another simgraph preprocess is writing it" in err
    assert {k: v for k, v in _tree(out).items() if k != ".lock"} == before


def test_a_run_refuses_a_dataset_rebuilt_while_it_trains(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``preprocess --overwrite`` swaps a rebuild in after the run started: the kNN loaders,
    which open the split files only at the first kNN epoch, refuse it naming what changed."""
    from components.config import PretrainConfig, from_dict
    from components.data.reader import DatasetError
    from components.runs.recipe import run_pretraining
    from components.runs.worker import PretrainRecipe

    ds = tmp_path / "ds"
    shutil.copytree(data, ds)
    cfg = from_dict(PretrainConfig, tiny_run_config(
        ds, tmp_path / "runs", knn__every_epochs=1, train__epochs=2,
        scaling={"num_workers": 1, "cpus_per_worker": 1.0, "host": "in_process"}))
    real = PretrainRecipe.train_epoch

    def rebuilt_meanwhile(self: PretrainRecipe, epoch: int) -> dict[str, Any]:
        row = real(self, epoch)
        shutil.rmtree(ds)  # the swap of an --overwrite rebuild (other data, other params)
        synthetic_dataset(ds, size=16, train_per_class=8, val_per_class=2, seed=1)
        return row

    monkeypatch.setattr(PretrainRecipe, "train_epoch", rebuilt_meanwhile)
    t0 = time.monotonic()
    with pytest.raises(DatasetError) as e:
        run_pretraining(cfg, echo=False)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and time.monotonic() - t0 < 120
    assert f"the dataset {ds} changed since the run started" in msg
    assert "build parameters, split files (train, val) differ" in msg
    assert "the kNN evaluation would read other data" in msg
    assert "start a new run" in msg


def _rebuild(ds: Path) -> None:
    """What a ``preprocess --overwrite`` swap leaves: another dataset at the same path (other
    data, other build parameters)."""
    shutil.rmtree(ds)
    synthetic_dataset(ds, size=16, train_per_class=8, val_per_class=2, seed=1)


@pytest.mark.parametrize("when", ["start", "restart"])
def test_a_worker_refuses_a_dataset_rebuilt_before_it_opens_the_train_split(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """The train loader opens its split file when a worker starts: ``start``, a rebuild
    swapped in after the driver checked the dataset; ``restart``, a worker started again
    (Ray Train after a worker failure, with the run's dataset identity from its start) after
    epoch 1's checkpoint, on a rebuilt dataset. Either is refused in one line before a step
    trains on the new data or a worker record is written; the run dir byte-identical."""
    import dataclasses

    import components.runs.recipe
    from components.config import PretrainConfig, from_dict
    from components.data.reader import DatasetError
    from components.runs.dataset_checks import check_dataset
    from components.runs.hosts import InProcess
    from components.runs.recipe import loop_config, run_pretraining
    from components.runs.run_dir import absolute_paths
    from components.runs.worker import PretrainRecipe

    ds = tmp_path / "ds"
    shutil.copytree(data, ds)
    cfg = from_dict(PretrainConfig, tiny_run_config(
        ds, tmp_path / "runs", knn__every_epochs=0, train__epochs=2,
        scaling={"num_workers": 1, "cpus_per_worker": 1.0, "host": "in_process"}))
    run_dir = tmp_path / "runs" / "run"
    trees: list[dict[str, str]] = []
    if when == "start":
        real = components.runs.recipe._train_in_process

        def swapped_first(*args: Any) -> list[dict[str, Any]]:
            _rebuild(ds)
            trees.append(_tree(run_dir))
            return real(*args)

        monkeypatch.setattr(components.runs.recipe, "_train_in_process", swapped_first)
        with pytest.raises(DatasetError) as e:
            run_pretraining(cfg, echo=False)
    else:
        one = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=1))
        run_pretraining(one, echo=False)
        cfg = absolute_paths(cfg)
        facts = check_dataset(cfg)  # what the driver handed its workers at the run's start
        _rebuild(ds)
        trees.append(_tree(run_dir))
        assert "epoch_00001/state.pt" in trees[0]
        with pytest.raises(DatasetError) as e:
            PretrainRecipe(loop_config(cfg, str(run_dir), facts),
                           host=InProcess(str(run_dir), cfg.checkpoint.keep)).run()
    msg = str(e.value)
    assert len(msg.splitlines()) == 1, msg
    assert f"the dataset {ds} changed since the run started" in msg
    assert "the training loader would read other data than the run trained on" in msg
    assert _tree(run_dir) == trees[0]


def test_verify_identity_is_quiet_for_the_same_dataset_and_names_a_missing_manifest(
        data: Path, tmp_path: Path) -> None:
    from components.data.identity import dataset_identity
    from components.data.integrity import verify_identity
    from components.data.reader import DatasetError

    identity = dataset_identity(json.loads((data / "manifest.json").read_text()))
    verify_identity(str(data), identity, "run", "the kNN evaluation")  # the same: quiet
    ds = tmp_path / "ds"
    shutil.copytree(data, ds)
    (ds / "manifest.json").unlink()  # mid-swap: the old manifest aside, the new not yet in
    with pytest.raises(DatasetError, match="cannot be read before the kNN evaluation .*being "
                                           "rebuilt or was removed"):
        verify_identity(str(ds), identity, "run", "the kNN evaluation")

"""``simgraph pretrain`` on Ray Train: exact resume after a SIGKILL and after a worker failover,
interrupted checkpoints, and the driver's checks (all on a synthetic dataset, 2 CPU workers)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from components.config import ConfigError, PretrainConfig, from_dict
from components.runs.checkpoint import is_complete_at, load_state, local_copy
from components.runs.checkpoints import latest_complete
from components.runs.dataset_checks import check_dataset
from components.runs.diagnostics import PAUSE_ENV
from components.runs.errors import RunError
from components.runs.run_dir import prepare_run_dir
from tests.support.datasets import synthetic_dataset, tiny_run_config
from tests.support.procs import kill_session, session_pids

ROOT = Path(__file__).resolve().parents[2]
# Rank-local timings: everything else in a history row must match exactly.
TIMING = {"samples_per_s", "data_wait", "time_s", "eval_s"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_dataset(tmp_path_factory.mktemp("pretrain") / "ds")


def _start(cfg: dict[str, Any], tmp: Path, pause_at_step: int = 0,
           verbose: bool = False) -> subprocess.Popen:
    path = tmp / f"{cfg['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, PAUSE_ENV: str(pause_at_step)}
    env.pop("SIMGRAPH_VERBOSE", None)
    log = open(tmp / f"{cfg['name']}.log", "a")  # noqa: SIM115 - closed with the process
    flags = ["--verbose"] if verbose else []
    return subprocess.Popen([sys.executable, "-m", "pipelines.cli", *flags, "pretrain", str(path)],
                            cwd=ROOT, env=env, start_new_session=True, stdout=log,
                            stderr=subprocess.STDOUT, preexec_fn=_as_from_a_terminal)


def _as_from_a_terminal() -> None:
    """SIGINT at its default, as in a shell at a terminal: a test suite started in the
    background (``make test &``) hands its children SIGINT ignored, and Python then never
    raises KeyboardInterrupt, so the Ctrl-C test would wait on a run that cannot hear it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _finish(proc: subprocess.Popen, tmp: Path, name: str, timeout: float = 400) -> None:
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        kill_session(proc.pid)
    assert rc == 0, (tmp / f"{name}.log").read_text()[-4000:]


def _wait_for(cond: Any, proc: subprocess.Popen, tmp: Path, name: str, timeout: float = 300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited early:\n"
                                 + (tmp / f"{name}.log").read_text()[-4000:])
        time.sleep(0.2)
    kill_session(proc.pid)
    raise AssertionError(f"timed out waiting; log:\n{(tmp / f'{name}.log').read_text()[-4000:]}")


def _final(run_dir: Path | str) -> dict[str, Any]:
    best = latest_complete(run_dir)
    assert best is not None, f"no complete checkpoint in {run_dir}"
    with local_copy(best[1]) as d:  # a URI's is downloaded
        return load_state(d)


def _registered(run_dir: Path, name: str) -> bool:
    snap = run_dir / "checkpoint_manager_snapshot.json"
    return snap.exists() and name in snap.read_text()


@pytest.mark.slow
def test_killed_run_and_killed_worker_resume_to_identical_weights_and_metrics(
        dataset: Path, tmp_path: Path, s3_uri: str) -> None:
    """4 epochs straight vs: 2 epochs, SIGKILL of the whole process tree, re-run, and in the
    re-run one worker SIGKILLed in epoch 4 (``scaling.max_failures=1``: Ray Train restarts the
    group from epoch 3's checkpoint): identical weights, optimizer, history and metrics.

    CoNe: its first step (empty bank) leaves the projector without a gradient under DDP. A
    half-written ``epoch_00003`` (what a kill during the upload leaves) is planted before the
    re-run: it must not be used, and the resumed run writes a complete one over it.

    The straight run reads its dataset from S3 and writes its run dir there (moto,
    tests/support/s3.py): staged once for both workers, then resumed in-process from the S3
    checkpoint and evaluated from S3 (:func:`_straight_run_in_s3_resumes_and_evaluates`).
    """
    from components.io import storage

    cone = {"name": "cone", "bank_size": 40, "top_n": 4}
    remote = storage.join(s3_uri, "datasets", "syn")
    storage.upload_dir(dataset, remote)
    runs = storage.join(s3_uri, "runs")
    straight = tiny_run_config(remote, tmp_path / "unused", name="straight", loss=cone,
                               data__stage_dir=str(tmp_path / "stage"))
    straight["storage"] = runs  # tiny_run_config takes Paths; URIs go in as they are
    _finish(_start(straight, tmp_path, verbose=True), tmp_path, "straight")
    loud = (tmp_path / "straight.log").read_text()
    assert "TrainingReport(" in loud  # --verbose: Ray Train's own lines too
    reference = _final(storage.join(runs, "straight"))

    killed = tiny_run_config(dataset, tmp_path / "runs", name="killed", loss=cone,
                             scaling__max_failures=1, tracking={"mlflow": True, "wandb": True})
    steps = 4  # 128 train samples / (2 workers × 16)
    proc = _start(killed, tmp_path, pause_at_step=2 * steps + 1)
    run_dir = tmp_path / "runs" / "killed"
    log = tmp_path / "killed.log"
    # Killed in epoch 3, once epoch 2's checkpoint is registered and its line is in the log:
    # the line comes through Ray's log monitor, which the kill could otherwise beat (with
    # Train's 0.25 s poll the checkpoint is registered within a fraction of a second)
    _wait_for(lambda: (run_dir / "workers" / "paused-rank0-step9").exists()
              and _registered(run_dir, "epoch_00002")
              and "[simgraph] epoch 2/4" in log.read_text(), proc, tmp_path, "killed")
    kill_session(proc.pid)
    assert proc.wait(timeout=30) != 0 and not session_pids(proc.pid)
    assert latest_complete(run_dir)[0] == 2  # type: ignore[index]
    partial = run_dir / "epoch_00003"
    partial.mkdir()
    (partial / "state.pt").write_bytes(b"\x80\x02 half a pickle")

    # The re-run; its rank 1 killed in epoch 4, once epoch 3's checkpoint is registered
    proc = _start(killed, tmp_path, pause_at_step=3 * steps + 2)
    _wait_for(lambda: (run_dir / "workers" / "paused-rank1-step14").exists()
              and _registered(run_dir, "epoch_00003")
              and "[simgraph] epoch 3/4" in log.read_text(), proc, tmp_path, "killed")
    victim = json.loads((run_dir / "workers" / "rank1.json").read_text())["pid"]
    os.kill(victim, signal.SIGKILL)
    _finish(proc, tmp_path, "killed")
    assert json.loads((run_dir / "workers" / "rank1.json").read_text())["pid"] != victim
    quiet = log.read_text()
    assert quiet.count("resumed 'killed' after epoch 2") == 1
    assert quiet.count("resumed 'killed' after epoch 3") == 1  # Train's restart of the group
    # Quiet by default: the run summary and one line per epoch, none of Ray Train's dumps.
    assert "TrainingReport(" not in quiet and "Checkpoint successfully created" not in quiet
    assert "peak LR" in quiet and "2 worker(s) x 16 = 32 global" in quiet
    # (the killed process got through epochs 1-2, the re-run did 3-4; each line once)
    assert [line.split("  ")[0] for line in quiet.splitlines()
            if line.startswith("[simgraph] epoch")] == [f"[simgraph] epoch {e}/4"
                                                        for e in (1, 2, 3, 4)]
    # tracking.mlflow: one MLflow run, continued by the resume, every epoch once
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    (mrun,) = client.search_runs([client.get_experiment_by_name("simgraph").experiment_id])
    assert mrun.info.status == "FINISHED" and mrun.data.params["loss.name"] == "cone"
    assert [m.step for m in client.get_metric_history(mrun.info.run_id, "loss")] == [1, 2, 3, 4]
    # tracking.wandb (offline): every rank-0 process (the killed one, the re-run's, the
    # restarted worker's) continues the same W&B run id with the epochs it trained (a killed
    # process's run may have lost unflushed records)
    from tests.support.wandb_offline import offline_runs

    *_, restarted = offline_runs(run_dir)
    dirs = sorted((run_dir / "wandb").glob("offline-run-*"))  # <time>-<run id>, per process
    assert len(dirs) == 3 and {d.name.rsplit("-", 1)[1] for d in dirs} == {restarted.run_id}
    assert restarted.name == "killed" and restarted.config["loss"]["name"] == "cone"
    assert [h["epoch"] for h in restarted.history if "loss" in h] == [4]

    a, b = reference, _final(run_dir)
    assert a["epoch"] == b["epoch"] == 4 and a["step"] == b["step"] == 16
    _same_training(a, b)
    assert [r["epoch"] for r in b["history"]] == [1, 2, 3, 4]
    assert 0.0 <= b["history"][-1]["knn_top1"] <= 1.0
    assert b["model"]["objective.bank.features"].abs().sum() > 0  # the memory bank was restored
    # metrics.csv holds each epoch once, even though the killed run had logged epoch 2
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2", "3", "4"]

    _straight_run_in_s3_resumes_and_evaluates(straight, dataset, tmp_path)


def _straight_run_in_s3_resumes_and_evaluates(cfg: dict[str, Any], dataset: Path,
                                              tmp: Path) -> None:
    """The S3 half of the killed-run test: ``cfg`` trained 4 epochs on 2 Ray Train workers from
    a dataset in S3 into a run dir in S3."""
    import csv
    import io

    from components.data.staging import MARKER
    from components.io import storage

    run_dir = storage.join(cfg["storage"], cfg["name"])
    assert {"config.yaml", "metrics.csv", "workers", "tb", "epoch_00004"} <= set(
        storage.list_dir(run_dir))
    assert not (ROOT / "s3:").exists()  # nothing went to a local look-alike path
    done = latest_complete(run_dir)
    assert done is not None and done[0] == 4 and is_complete_at(done[1])
    rows = list(csv.DictReader(io.StringIO(storage.read_text(storage.join(run_dir,
                                                                          "metrics.csv")))))
    assert [r["epoch"] for r in rows] == ["1", "2", "3", "4"]
    staged = [d for d in (tmp / "stage").iterdir() if d.is_dir()]
    assert len(staged) == 1 and (staged[0] / MARKER).exists()  # one copy for both workers
    assert (staged[0] / "train.beton").read_bytes() == (dataset / "train.beton").read_bytes()

    # Longer training resumes from the checkpoint in S3 and keeps the first epochs' history;
    # on one worker, so in this process (scaling.host=auto): the in-process host reads and
    # writes S3 as Ray Train's does
    longer = {**cfg, "train": {"epochs": 5}, "scaling": {"num_workers": 1,
                                                          "cpus_per_worker": 1.0}}
    log = tmp / f"{cfg['name']}.log"  # _start appends: this run's lines come after `seen`
    seen = len(log.read_text())
    _finish(_start(longer, tmp), tmp, cfg["name"])
    out = log.read_text()[seen:]
    assert "resumed 'straight' after epoch 4" in out
    assert "hiding known-harmless Ray" not in out  # no Ray was started: trained in-process
    history = _final(run_dir)["history"]
    assert [h["epoch"] for h in history] == [1, 2, 3, 4, 5]
    assert [float(r["loss"]) for r in rows] == pytest.approx([h["loss"] for h in history[:4]])

    evaluate = subprocess.run([sys.executable, "-m", "pipelines.cli", "evaluate", run_dir],
                              cwd=tmp, text=True, capture_output=True, timeout=600)
    assert evaluate.returncode == 0, (evaluate.stdout + evaluate.stderr)[-4000:]
    report = storage.read_text(storage.join(run_dir, "eval", "report.md"))
    assert "# Evaluation of `straight`" in report
    assert {"metrics.json", "knn_vs_k.png"} <= set(storage.list_dir(storage.join(run_dir,
                                                                                "eval")))


def _one_worker(dataset: Path, storage: Path, name: str, host: str = "auto") -> dict[str, Any]:
    """A 3-epoch one-worker run (in this process unless ``host`` says otherwise) that keeps
    every checkpoint, so that epoch 1's can be compared too."""
    return tiny_run_config(dataset, storage, name=name, train__epochs=3,
                           scaling__num_workers=1, scaling__cpus_per_worker=1.0,
                           scaling__host=host, checkpoint__keep=3)


@pytest.fixture(scope="module")
def in_process_run(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted one-worker run in the ``simgraph pretrain`` process (the default for a
    local one-worker CPU run): the reference of the in-process, host-switch and Ctrl-C tests."""
    tmp = tmp_path_factory.mktemp("reference")
    _finish(_start(_one_worker(dataset, tmp / "runs", "local"), tmp), tmp, "local")
    assert "hiding known-harmless Ray" not in (tmp / "local.log").read_text()  # no Ray started
    return tmp / "runs" / "local"


def _same_training(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Weights, optimizer and scheduler state, and history (timings aside) identical."""
    assert a["epoch"] == b["epoch"] and a["step"] == b["step"]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for key in ("optimizer", "scheduler"):
        assert repr(a[key]) == repr(b[key]), key
    assert ([{k: v for k, v in r.items() if k not in TIMING} for r in a["history"]]
            == [{k: v for k, v in r.items() if k not in TIMING} for r in b["history"]])


@pytest.mark.slow
def test_in_process_run_matches_ray_train_and_resumes_the_same_way(
        dataset: Path, in_process_run: Path, tmp_path: Path) -> None:
    """``scaling.host``: Ray Train's epoch-1 checkpoint of a one-worker run (killed in epoch
    2) equals the in-process run's for the same seed — weights, optimizer state, history —
    and the in-process host resumes it to the uninterrupted run's end."""
    steps = 8  # 128 train samples / (1 worker × 16)
    mixed = _one_worker(dataset, tmp_path / "runs", "mixed", host="ray_train")
    proc = _start(mixed, tmp_path, pause_at_step=steps + 1)
    run_dir = tmp_path / "runs" / "mixed"
    _wait_for(lambda: (run_dir / "workers" / f"paused-rank0-step{steps + 1}").exists()
              and _registered(run_dir, "epoch_00001"), proc, tmp_path, "mixed")
    kill_session(proc.pid)
    assert proc.wait(timeout=30) != 0 and latest_complete(run_dir)[0] == 1  # type: ignore[index]
    _same_training(load_state(in_process_run / "epoch_00001"),
                   load_state(run_dir / "epoch_00001"))
    _finish(_start({**mixed, "scaling": {**mixed["scaling"], "host": "in_process"}},
                   tmp_path), tmp_path, "mixed")
    assert "resumed 'mixed' after epoch 1" in (tmp_path / "mixed.log").read_text()
    ref = _final(in_process_run)
    assert ref["epoch"] == 3
    _same_training(ref, _final(run_dir))


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_the_run_resumes_to_the_same_weights(
        dataset: Path, in_process_run: Path, tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) in epoch 2 of an in-process run: exit 130, one line and no traceback;
    the same command resumes after epoch 1 and ends where an uninterrupted run ends."""
    steps = 8  # 128 train samples / (1 worker × 16)
    stopped = _one_worker(dataset, tmp_path / "runs", "stopped")
    proc = _start(stopped, tmp_path, pause_at_step=steps + 1)
    run_dir = tmp_path / "runs" / "stopped"
    _wait_for(lambda: (run_dir / "workers" / f"paused-rank0-step{steps + 1}").exists(),
              proc, tmp_path, "stopped")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    log = (tmp_path / "stopped.log").read_text()
    assert "Traceback" not in log and log.count("simgraph pretrain: interrupted (Ctrl-C)") == 1
    _finish(_start(stopped, tmp_path), tmp_path, "stopped")
    assert "resumed 'stopped' after epoch 1" in (tmp_path / "stopped.log").read_text()
    a, b = _final(in_process_run), _final(run_dir)
    assert a["epoch"] == b["epoch"] == 3
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_where_a_run_trains() -> None:
    from components.runs.recipe import trains_in_process

    def config(**scaling: Any) -> PretrainConfig:
        return from_dict(PretrainConfig, {"name": "r", "data": {"dataset": "d"},
                                          "scaling": scaling})

    assert trains_in_process(config(num_workers=1))
    assert not trains_in_process(config(num_workers=2))
    assert not trains_in_process(config(num_workers=1, max_failures=2))  # Train restarts it
    assert not trains_in_process(config(num_workers=1, use_gpu=True))
    assert not trains_in_process(config(num_workers=1, host="ray_train"))
    with pytest.MonkeyPatch.context() as mp:  # a cluster: its workers, not this process
        mp.setenv("RAY_ADDRESS", "ray://head:10001")
        assert not trains_in_process(config(num_workers=1))
        assert trains_in_process(config(num_workers=1, host="in_process"))
    for scaling, needs in (({"num_workers": 2}, "scaling.num_workers=1"),
                           ({"use_gpu": True}, "scaling.use_gpu=false"),
                           ({"max_failures": 1}, r"scaling.max_failures=0")):
        with pytest.raises(ConfigError, match=rf"scaling.host=in_process needs {needs}.*use "
                                              r"scaling.host=ray_train \(or auto\)"):
            config(host="in_process", **scaling)


# ---------------------------------------------------------------------------------------------
# Driver checks (no Ray).


def test_rerun_with_another_config_is_refused(dataset: Path, tmp_path: Path) -> None:
    cfg = from_dict(PretrainConfig, tiny_run_config(dataset, tmp_path))
    prepare_run_dir(cfg)
    # allowed on resume: more epochs, other scaling, what a diverged run is told to change
    prepare_run_dir(from_dict(PretrainConfig, tiny_run_config(dataset, tmp_path, train__epochs=8,
                                                      scaling__num_workers=1)))
    prepare_run_dir(from_dict(PretrainConfig, tiny_run_config(dataset, tmp_path, optim__lr=0.05,
                                                      train__grad_clip=1.0)))
    other = from_dict(PretrainConfig, tiny_run_config(dataset, tmp_path, optim__momentum=0.5))
    with pytest.raises(RunError, match=r"optim\.momentum differ"):
        prepare_run_dir(other)


@pytest.mark.parametrize(
    ("loss", "error"),
    [
        ({"name": "clip"}, "caption_dim=384 but .* 8-d"),
        ({"name": "clip", "caption_dim": 8}, None),
        ({"name": "xclr", "graph": "class"}, None),
        ({"name": "cone", "bank_size": 64, "top_n": 4}, None),
    ],
)
def test_dataset_checks(dataset: Path, tmp_path: Path, loss: dict, error: str | None) -> None:
    cfg = from_dict(PretrainConfig, tiny_run_config(dataset, tmp_path, loss=loss))
    if error is not None:
        with pytest.raises(RunError, match=error):
            check_dataset(cfg)
        return
    facts = check_dataset(cfg)
    assert facts.num_classes == 4 and facts.knn and facts.caption_dim == 8


def test_dataset_without_captions_or_enough_samples(tmp_path: Path) -> None:
    ds = synthetic_dataset(tmp_path / "nocap", train_per_class=2, val_per_class=1)
    manifest = json.loads((ds / "manifest.json").read_text())
    del manifest["fields"]["caption"]
    (ds / "manifest.json").write_text(json.dumps(manifest))
    cfg = from_dict(PretrainConfig, tiny_run_config(ds, tmp_path, loss={"name": "xclr",
                                                                 "graph": "caption"}))
    with pytest.raises(RunError, match="needs caption embeddings"):
        check_dataset(cfg)
    cfg = from_dict(PretrainConfig, tiny_run_config(ds, tmp_path))  # 8 samples < 2 × 16
    with pytest.raises(RunError, match="fewer than one global batch"):
        check_dataset(cfg)
    with pytest.raises(RunError, match="no manifest.json"):
        check_dataset(from_dict(PretrainConfig, tiny_run_config(tmp_path / "missing", tmp_path)))


def test_latest_complete_skips_interrupted_writes(tmp_path: Path) -> None:
    from components.runs.checkpoint import save_state

    save_state(tmp_path / "epoch_00001", {"epoch": 1, "step": 4, "w": torch.ones(3)})
    save_state(tmp_path / "epoch_00002", {"epoch": 2, "step": 8, "w": torch.ones(3)})
    shutil.copytree(tmp_path / "epoch_00002", tmp_path / "epoch_00003")
    (tmp_path / "epoch_00003" / "meta.json").unlink()  # killed before meta.json was written
    shutil.copytree(tmp_path / "epoch_00002", tmp_path / "epoch_00004")
    with open(tmp_path / "epoch_00004" / "state.pt", "r+b") as f:  # truncated state
        f.truncate(10)
    best = latest_complete(tmp_path)
    assert best is not None and best[0] == 2 and Path(best[1]).name == "epoch_00002"

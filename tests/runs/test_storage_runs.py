"""Runs whose dataset, run dir and reports live in S3 (moto on 127.0.0.1, tests/support/s3.py):
pretrain from a staged copy, resume from the S3 checkpoint, evaluate from S3. (A sweep in S3:
tests/e2e/test_sweep.py::test_a_repeats_sweep_in_s3_trains_seeds_and_the_searcher_sees_their_mean.)"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.data.staging import MARKER
from components.io import storage
from components.runs.checkpoint import is_complete_at, load_state, local_copy
from components.runs.checkpoints import latest_complete
from tests.support.datasets import synthetic_dataset, tiny_run_config

ROOT = Path(__file__).resolve().parents[2]


def _simgraph(*args: str, cwd: Path, rc: int = 0) -> str:
    p = subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=cwd, text=True,
                       capture_output=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == rc, (p.stdout + p.stderr)[-4000:]
    return p.stdout + p.stderr


@pytest.mark.slow
def test_pretrain_resume_and_evaluate_with_s3_storage(s3_uri: str, tmp_path: Path) -> None:
    local = synthetic_dataset(tmp_path / "syn", size=16)
    dataset = storage.join(s3_uri, "datasets", "syn")
    storage.upload_dir(local, dataset)
    runs = storage.join(s3_uri, "runs")
    stage = tmp_path / "stage"
    cfg = tiny_run_config(dataset, runs, name="s3run", train__epochs=2, loss__name="supcon",
                          data__stage_dir=str(stage), knn__k=5)
    cfg["storage"] = runs  # tiny_run_config takes Paths; URIs go in as they are
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    _simgraph("pretrain", str(tmp_path / "run.yaml"), cwd=tmp_path)

    run_dir = storage.join(runs, "s3run")
    assert {"config.yaml", "metrics.csv", "workers", "tb", "epoch_00002"} <= set(
        storage.list_dir(run_dir))
    assert not (tmp_path / "s3:").exists()  # nothing went to a local look-alike path
    done = latest_complete(run_dir)
    assert done is not None and done[0] == 2 and is_complete_at(done[1])
    rows = list(csv.DictReader(io.StringIO(storage.read_text(storage.join(run_dir,
                                                                          "metrics.csv")))))
    assert [r["epoch"] for r in rows] == ["1", "2"]
    staged = [d for d in stage.iterdir() if d.is_dir()]
    assert len(staged) == 1 and (staged[0] / MARKER).exists()  # one copy for both workers
    assert (staged[0] / "train.beton").read_bytes() == (local / "train.beton").read_bytes()

    # Longer training resumes from the checkpoint in S3 and keeps the first epochs' history;
    # on one worker, so in this process (scaling.host=auto): the in-process host reads and
    # writes S3 as Ray Train's does, and the suite pays one Ray Train run less (~30 CPU-s)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(
        {**cfg, "train": {"epochs": 3}, "scaling": {"num_workers": 1, "cpus_per_worker": 1.0}}))
    out = _simgraph("pretrain", str(tmp_path / "run.yaml"), cwd=tmp_path)
    assert "resumed 's3run' after epoch 2" in out
    assert "hiding known-harmless Ray" not in out  # no Ray was started: trained in-process
    done = latest_complete(run_dir)
    assert done is not None and done[0] == 3
    with local_copy(done[1]) as d:
        history = load_state(d)["history"]
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert [float(r["loss"]) for r in rows] == pytest.approx([h["loss"] for h in history[:2]])

    _simgraph("evaluate", run_dir, cwd=tmp_path)
    report = storage.read_text(storage.join(run_dir, "eval", "report.md"))
    assert "# Evaluation of `s3run`" in report
    assert {"metrics.json", "knn_vs_k.png"} <= set(storage.list_dir(storage.join(run_dir,
                                                                                "eval")))

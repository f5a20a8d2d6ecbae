"""``simgraph run``: the demo's plan validates up front; a tiny pipeline runs end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.config import ConfigError
from pipelines.run import plan

ROOT = Path(__file__).resolve().parents[2]


def test_demo_plan() -> None:
    pre, runs = plan(str(ROOT / "pipelines/configs/demo.yaml"), [])
    assert pre.source.kind == "fashion-mnist"
    assert {k: (c.name, c.loss.name) for k, c in runs.items()} == {
        "simclr": ("demo-simclr", "simclr"), "supcon": ("demo-supcon", "supcon"),
        "xclr": ("demo-xclr", "xclr")}
    assert all(c.data.dataset == pre.output for c in runs.values())
    assert all(c.scaling.num_workers == 2 for c in runs.values())


def test_a_bad_override_in_any_run_fails_before_work(tmp_path: Path) -> None:
    spec = {"preprocess": str(ROOT / "pipelines/configs/data/demo.yaml"),
            "pretrain": str(ROOT / "pipelines/configs/pretrain/demo.yaml"),
            "runs": {"a": ["loss.name=simclr"], "b": ["loss.name=sincere", "loss.tau_s=0.1"]}}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError, match="unknown key loss.tau_s for 'sincere'"):
        plan(str(path), [])


@pytest.mark.slow
def test_tiny_pipeline_end_to_end(tmp_path: Path) -> None:
    spec = {
        "preprocess": str(ROOT / "pipelines/configs/data/demo.yaml"),
        "pretrain": str(ROOT / "pipelines/configs/pretrain/demo.yaml"),
        "prefix": "tiny",
        # relative paths, as in the shipped configs: resolved against the working directory
        # (Ray Train workers run elsewhere)
        "overrides": ["storage=runs", "train.epochs=2", "data.batch_size=32"],
        # one run on Ray Train (the demo's 2 workers), one in this process (1 worker): a plan
        # mixes both, and the suite pays one Ray Train run instead of two (~25 CPU-s)
        "runs": {"simclr": ["loss.name=simclr"],
                 "xclr": ["loss.name=xclr", "loss.tau_s=0.2", "scaling.num_workers=1"]},
    }
    pre = yaml.safe_load((ROOT / "pipelines/configs/data/demo.yaml").read_text())
    pre.update(output="data", source={"kind": "fashion-mnist",
                                                      "max_per_class": 12})
    (tmp_path / "pre.yaml").write_text(yaml.safe_dump(pre))
    spec["preprocess"] = str(tmp_path / "pre.yaml")
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(spec))
    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", str(tmp_path / "p.yaml")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    # Quiet by default (issue 15): no Ray Train report dumps, about a screen per run (the
    # demo's 3 runs × 8 epochs print 94 lines).
    console = out.stdout + out.stderr
    assert "TrainingReport(" not in console and "Checkpoint successfully created" not in console
    assert len(console.splitlines()) <= 30 + 25 * 2, console
    table = out.stdout[out.stdout.index("| run |"):]
    assert "| simclr | simclr | 2 |" in table and "| xclr | xclr | 2 |" in table
    for name in ("tiny-simclr", "tiny-xclr"):
        run_dir = tmp_path / "runs" / name
        assert (run_dir / "metrics.csv").read_text().count("\n") == 3  # header + 2 epochs
        assert (run_dir / "epoch_00002" / "meta.json").exists()

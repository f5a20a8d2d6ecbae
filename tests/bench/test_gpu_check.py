"""bench/gpu_check.py's runner, on CPU: a hung stage fails within its timeout (its whole
process group killed), a stage after a failed prerequisite or past the budget is skipped saying
why, and the report names every stage. The stages themselves need a GPU (docs/gpu.md)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check  # noqa: E402


def test_a_hung_command_is_killed_with_its_children_at_the_timeout(tmp_path: Path) -> None:
    marker = tmp_path / "child-alive"
    # a child that would outlive its parent's kill if only the parent died
    script = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
              f"\"import time; time.sleep(3); open('{marker}', 'w').write('x')\"]); "
              "print('started', flush=True); time.sleep(60)")
    t0 = time.monotonic()
    rc, out = gpu_check.run_cmd([sys.executable, "-c", script], timeout=1.5)
    assert rc is None and "started" in out and time.monotonic() - t0 < 10
    time.sleep(4)
    assert not marker.exists()


class FakeCheck(gpu_check.Check):
    def plan(self) -> list[gpu_check.Stage]:
        return [gpu_check.Stage("dataset", 0, 5), gpu_check.Stage("hang", 0, 1, ("dataset",)),
                gpu_check.Stage("after", 0, 5, ("hang",)),
                gpu_check.Stage("big", 10_000, 5, ("dataset",))]

    def s_dataset(self, st: gpu_check.Stage) -> None:
        st.status, st.detail = "PASS", "built"

    def s_hang(self, st: gpu_check.Stage) -> None:
        self.cli(st, [])  # replaced below by a sleeping command


def test_stages_report_fail_skip_and_why(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(gpu_check, "CLI", [sys.executable, "-c", "import time; time.sleep(30)"])
    args = argparse.Namespace(work=str(tmp_path), budget=60.0, cpu=True)
    check = FakeCheck(args)
    check.has_ray = True
    assert check.run(None) == 1
    by = {s.name: s for s in check.stages}
    assert by["dataset"].status == "PASS"
    assert by["hang"].status == "FAIL" and "timed out after 1 s" in by["hang"].detail
    assert by["after"].status == "SKIP" and by["after"].detail == "needs hang"
    assert by["big"].status == "SKIP" and "out of budget" in by["big"].detail
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[:2] for ln in lines] == [["PASS", "dataset"], ["FAIL", "hang"],
                                               ["SKIP", "after"], ["SKIP", "big"]]


def test_ray_stages_are_skipped_without_ray(tmp_path: Path) -> None:
    args = argparse.Namespace(work=str(tmp_path), budget=60.0, cpu=True)
    check = FakeCheck(args)
    check.has_ray = False
    check.run(None)
    assert all(s.status == "SKIP" and "Ray does not import" in s.detail for s in check.stages)

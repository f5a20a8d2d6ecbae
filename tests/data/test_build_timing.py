"""Issue 42, item 2: the build's clock (``components/data/build/timing.py``): each stage's wall
seconds, nested stages counted once, written into ``manifest.json`` as ``build_seconds`` with
every stage present; the timings stay out of the dataset's identity."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from components.data.build import planning
from components.data.build.timing import STAGES, BuildTimes
from components.data.identity import dataset_identity
from pipelines.preprocess import run
from tests.data.test_build_transactions import _cfg, _images


def test_every_stage_starts_at_zero_and_add_sums() -> None:
    t = BuildTimes()
    assert t.as_dict() == dict.fromkeys(STAGES, 0.0)
    assert list(t.as_dict()) == list(STAGES)  # in the order the stages run
    t.add("hashing", 0.25)
    t.add("hashing", 0.5)
    t.add("merge", 0.0004)
    assert t.as_dict()["hashing"] == 0.75 and t.as_dict()["merge"] == 0.0  # to the ms
    assert "hashing 0.8" in t.line() and "(total 0.8 s)" in t.line()


@pytest.mark.parametrize("stage, seconds", [("hash", 1.0), ("hashing", -0.1),
                                            ("hashing", float("nan"))])
def test_unknown_stages_and_negative_seconds_are_refused(stage: str, seconds: float) -> None:
    with pytest.raises(ValueError, match="unknown build stage|must be >= 0"):
        BuildTimes().add(stage, seconds)


def test_a_nested_stage_is_counted_once_and_a_failing_block_is_timed() -> None:
    t = BuildTimes()
    with t.stage("planning"):
        time.sleep(0.02)
        with t.stage("near_duplicates"):
            time.sleep(0.05)
    s = t.seconds
    assert 0.05 <= s["near_duplicates"] < 0.5
    assert 0.02 <= s["planning"] < s["near_duplicates"]  # its own 0.02 s, not the inner 0.05
    with pytest.raises(RuntimeError), t.stage("merge"):
        time.sleep(0.01)
        raise RuntimeError("a failed merge")
    assert t.seconds["merge"] >= 0.01
    with pytest.raises(ValueError, match="unknown build stage"), t.stage("writing"):
        pass


def test_plan_times_the_near_duplicate_search_on_the_clock_it_is_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process plan (no Ray): hashing (``hash_local``, content not given) and the
    near-duplicate search are their own stages; planning.plan takes no clock of its own."""
    real = planning.integrity.near_duplicate_pairs

    def slow(*args: object, **kwargs: object) -> object:
        time.sleep(0.05)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(planning.integrity, "near_duplicate_pairs", slow)
    cfg = _cfg(tmp_path / "o", _images(tmp_path / "src"))
    t = BuildTimes()
    p = planning.plan(cfg, times=t)
    assert len(p.rows) == 8
    assert t.seconds["near_duplicates"] >= 0.05 and t.seconds["hashing"] > 0
    assert t.seconds["listing"] > 0
    assert planning.plan(cfg).rows == p.rows  # without a clock: the same plan


def test_a_built_manifest_records_every_stage_outside_its_identity(
        tmp_path: Path, ray_local: None) -> None:
    src = _images(tmp_path / "src")
    m = run(_cfg(tmp_path / "o", src), echo=False)
    took = m["build_seconds"]
    assert list(took) == list(STAGES)
    assert all(isinstance(v, float) and v >= 0 for v in took.values()), took
    assert took["hashing"] > 0 and took["shards"] > 0 and took["merge"] > 0, took
    assert took["captions"] < 1.0  # captions off: only the class files' few lines
    # Not digested: the parameters and the identity runs and checkpoints compare.
    assert "build_seconds" not in json.dumps(m["params"])
    assert "build_seconds" not in json.dumps(dataset_identity(m))

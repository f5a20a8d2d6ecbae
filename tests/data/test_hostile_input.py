"""Every wait is bounded and explained, every message is bounded (issue 39, principle 6):
hostile or malformed input gets one line naming the file and what to do — never a wait
without a word, a 254 MB message, a walk of the whole filesystem or a traceback — and
nothing that was there is lost."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from pathlib import Path

import pytest
import yaml

from pipelines.cli import main

# 302 bytes: nine levels of nine aliases, 9^9 (387 million) strings once expanded.
LAUGHS = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{b}: &{b} [*{a},*{a},*{a},*{a},*{a},*{a},*{a},*{a},*{a}]"
       for a, b in zip("abcdefgh", "bcdefghi", strict=True)]) + "\n"


def test_a_billion_laughs_yaml_is_one_short_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "laughs.yaml"
    bad.write_text(LAUGHS)
    assert len(LAUGHS.encode()) < 400
    t0 = time.monotonic()
    assert main(["validate", str(bad)]) == 2
    assert time.monotonic() - t0 < 10
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and len(err) < 500, err[:1000]
    assert str(bad) in err and "aliases" in err and "expand to more than" in err
    assert bad.read_text() == LAUGHS  # nothing changed


def test_every_yaml_reader_bounds_alias_expansion() -> None:
    """The neighbours of the config loader: label maps, a run dir's config.yaml, caption
    descriptions, submit's --runtime-env all read YAML a user hands over; all go through
    components.config.loading.safe_load (no other yaml.safe_load / yaml.load in the code)."""
    root = Path(__file__).resolve().parents[2]
    raw = [f"{p.relative_to(root)}:{i}" for p in [*root.glob("components/**/*.py"),
                                                  *root.glob("pipelines/**/*.py")]
           if p.name != "loading.py"
           for i, line in enumerate(p.read_text().splitlines(), 1)
           if "yaml.safe_load(" in line or "yaml.load(" in line or "yaml.full_load(" in line]
    assert not raw, f"YAML read without the alias budget: {raw}"


def test_a_billion_laughs_label_map_is_one_error(tmp_path: Path) -> None:
    from components.evaluation.labels import LabelMapError, load_label_map

    bad = tmp_path / "groups.yaml"
    bad.write_text(LAUGHS)
    t0 = time.monotonic()
    with pytest.raises(LabelMapError, match="expand to more than") as e:
        load_label_map(str(bad), ["a", "b"])
    assert time.monotonic() - t0 < 10 and len(str(e.value)) < 600


def test_a_few_aliases_are_fine(tmp_path: Path) -> None:
    from components.config.loading import load_yaml

    ok = tmp_path / "ok.yaml"
    ok.write_text("common: &c {lr: 0.1, wd: 0.0}\nrun1: *c\nrun2: *c\n")
    assert load_yaml(ok) == {"common": {"lr": 0.1, "wd": 0.0}, "run1": {"lr": 0.1, "wd": 0.0},
                             "run2": {"lr": 0.1, "wd": 0.0}}


@pytest.mark.parametrize("value", ["x" * 1_000_000, list(range(20_000)),
                                   {f"k{i}": i for i in range(20_000)}])
def test_a_huge_value_is_cut_in_the_message(
        value: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"name": "x", "data": {"dataset": "/d"},
                                   "train": {"epochs": value}}))
    assert main(["validate", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and len(err) < 800, err[:1000]
    assert "train.epochs=" in err and "must be an integer" in err
    assert "characters)" in err or "items)" in err  # says it was cut


def test_clip_keeps_short_values_as_repr() -> None:
    from components.errors import VALUE_LIMIT, bounded, clip

    assert clip("abc") == "'abc'" and clip(0.1) == "0.1" and clip([1, 2]) == "[1, 2]"
    long = clip("y" * 10_000)
    assert len(long) <= VALUE_LIMIT + 40 and long.endswith("(10000 characters)")
    msg = "head " + "z" * 50_000 + " tail: do this"
    cut = bounded(msg)
    assert len(cut) < 2_100 and cut.startswith("head ") and cut.endswith(" tail: do this")


def test_a_manifest_json_that_is_a_list_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("[1, 2]\n")
    cfg = tmp_path / "pre.yaml"
    cfg.write_text(yaml.safe_dump({
        "output": str(out), "source": {"kind": "folder", "path": str(tmp_path / "src")},
        "captions": {"missing": "from-label"}}))
    (tmp_path / "src" / "cat").mkdir(parents=True)
    assert main(["preprocess", str(cfg)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{out / 'manifest.json'} holds a JSON list" in err and "expected an object" in err
    assert (out / "manifest.json").read_text() == "[1, 2]\n"  # left as it was


def test_a_class_folder_linked_to_root_is_not_walked(tmp_path: Path) -> None:
    from components.data.sources import SYMLINK_OUT, SourceError, list_folder

    src = tmp_path / "src"
    (src / "cat").mkdir(parents=True)
    (src / "cat" / "a.png").write_bytes(b"x")
    (src / "everything").symlink_to("/")
    inside = src / "alias"
    inside.symlink_to(src / "cat")  # a link inside the source root is followed
    t0 = time.monotonic()
    got = list_folder(str(src))
    assert time.monotonic() - t0 < 5
    assert got.classes == ["alias", "cat"]
    assert [s.reason for s in got.skipped] == [SYMLINK_OUT]
    assert got.skipped[0].path == str(src / "everything")
    assert "symlink to / outside source.path" in got.skipped[0].detail
    with pytest.raises(SourceError, match=r"everything: a symlink to / outside source\.path"):
        list_folder(str(src), on_bad_input="error")


# ---------------------------------------------------------------------------------------------
# The staging lock: a held lock is explained and given up on.


def _dataset(tmp_path: Path) -> Path:
    from tests.support.datasets import synthetic_dataset

    return synthetic_dataset(tmp_path / "ds", classes=2, train_per_class=4, val_per_class=2,
                             size=8)


def test_a_held_staging_lock_says_who_holds_it_and_gives_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from components.data import staging
    from components.data.reader import DatasetError

    data = _dataset(tmp_path)
    cache = tmp_path / "cache"
    first = staging.stage_dataset_report(data, cache)  # a complete copy: must survive
    lock = cache / f"{first.path.name}.lock"
    monkeypatch.setenv(staging.LOCK_TIMEOUT_ENV, "1.5")
    monkeypatch.setattr(staging, "LOCK_REPORT_S", 0.5)
    with open(lock, "a") as f:  # another process's hold, as its lock file records it
        fcntl.flock(f, fcntl.LOCK_EX)
        with open(lock, "w") as w:
            json.dump({"host": "node-7", "pid": 4242, "started": "2026-11-26T10:00:00"}, w)
        t0 = time.monotonic()
        with pytest.raises(DatasetError) as e:
            staging.stage_dataset(data, cache)
        waited = time.monotonic() - t0
    assert 1.4 < waited < 10
    msg = str(e.value)
    assert len(msg.splitlines()) == 1
    assert f"gave up after 1.5 s waiting for the staging lock {lock}" in msg
    assert "held by pid 4242 on node-7 since 2026-11-26T10:00:00" in msg
    assert staging.LOCK_TIMEOUT_ENV in msg
    waits = [ln for ln in capsys.readouterr().err.splitlines() if "waiting for" in ln]
    assert len(waits) >= 2 and all("pid 4242 on node-7" in ln for ln in waits)
    # The complete copy was not touched, and is reused once the lock is free.
    assert staging.stage_dataset_report(data, cache).copied is False


def test_the_default_staging_folder_is_per_user_and_owner_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from components.data import staging
    from components.data.reader import DatasetError

    monkeypatch.delenv(staging.STAGE_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = staging.default_cache_dir()
    assert root == tmp_path / f"simgraph-stage-{os.getuid()}"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    data = _dataset(tmp_path)
    assert staging.stage_dataset(data).parent == root
    # Someone made it writable by others: refused, naming the folder and the fix.
    root.chmod(0o777)
    with pytest.raises(DatasetError, match=rf"{root} is writable by its group or others "
                                           rf"\(mode 0o777\).*chmod 700 {root}"):
        staging.stage_dataset(data)
    root.chmod(0o700)
    # Owned by someone else (here: a folder planted as another uid).
    monkeypatch.setattr(staging.os, "getuid", lambda: os.geteuid() + 1)
    planted = tmp_path / f"simgraph-stage-{os.geteuid() + 1}"
    planted.mkdir(mode=0o700)
    with pytest.raises(DatasetError, match=rf"{planted} belongs to uid {os.geteuid()}, not "
                                           rf"you \(uid {os.geteuid() + 1}\).*"
                                           rf"{staging.STAGE_ENV}"):
        staging.default_cache_dir()


def test_a_sweep_on_a_missing_dataset_is_one_line_before_any_trial(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Run from another folder, the base config's relative dataset does not exist there."""
    import ray

    from components.runtime import session

    started: list[bool] = []
    monkeypatch.setattr(session, "ray_session", lambda *a, **k: started.append(True))
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({"name": "b",
                                                        "data": {"dataset": "data/nope"}}))
    space = {"name": "s", "storage": str(tmp_path / "sweeps"), "base": "base.yaml",
             "metric": "knn_top1", "mode": "max", "num_samples": 2,
             "searcher": {"name": "random", "seed": 0},
             "space": {"optim.lr": {"loguniform": [0.01, 0.5]}}}
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    monkeypatch.chdir(tmp_path.parent)
    assert main(["sweep", str(tmp_path / "space.yaml")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "names data.dataset='data/nope'" in err and "no trial was started" in err
    assert f"{tmp_path.parent / 'data' / 'nope'} has no manifest.json" in err
    assert not started and not ray.is_initialized()
    assert not (tmp_path / "sweeps").exists()  # nothing written

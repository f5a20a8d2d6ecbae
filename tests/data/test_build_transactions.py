"""Issue 29, item 1: ``simgraph preprocess --overwrite`` is transactional.

A rebuild is written beside the current dataset (``<output>/.next/``) and swapped in only when
complete and verified; a failed, mistyped or interrupted rebuild leaves the previous dataset as
it was (manifest and split files byte-identical, ``DatasetInfo.load`` works, sha256s verify); a
swap killed half-way is finished, or rolled back, by the next run; a URI output is compared
with the remote manifest, not this host's cache.
"""

from __future__ import annotations

import dataclasses
import fcntl
import itertools
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from components.config import PreprocessConfig, from_dict
from components.data.build import driver, transaction
from components.data.reader import MANIFEST, DatasetInfo
from components.io.files import sha256_file
from pipelines.preprocess import PreprocessError, run

# The on-disk names of components/data/build/transaction.py's swap (spelled out, so that the
# tests that do not call the swap's functions run, and fail for what they check, on code
# without them).
NEXT, PREVIOUS, SWAP_JOURNAL, STAGE_MARK = ".next", ".previous", ".swap.json", ".staging.json"
LEFTOVERS = (NEXT, PREVIOUS, SWAP_JOURNAL)


def _json(obj: object) -> object:
    """``obj`` as it reads back from a JSON file (tuples become lists)."""
    return json.loads(json.dumps(obj))


def _images(root: Path, per_class: int = 4) -> Path:
    """``root/<cat|dog>/<k>.png``: small noise images (no two alike, so none is deduplicated)."""
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        for k in range(per_class):
            Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(
                root / cls / f"{k}.png")
    return root


def _cfg(out: Path, src: Path, val: float = 0.0, **over: object) -> PreprocessConfig:
    """The smallest build the preprocess tests use, without captions (no text encoder)."""
    data: dict[str, object] = {
        "output": str(out),
        "source": {"kind": "folder", "path": str(src)},
        "image": {"max_side": 12, "min_side": 8, "write_mode": "raw"},
        "split": {"val": val, "test": 0.0},
        "captions": {"enabled": False},
        "shard_size": 2,
        **over,
    }
    return from_dict(PreprocessConfig, data)


def _files(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative path -> hex), the lock file aside."""
    return {str(p.relative_to(root)): sha256_file(p) for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def _dataset(root: Path) -> dict[str, str]:
    """The dataset's own files (not the staging dir of a rebuild)."""
    return {k: v for k, v in _files(root).items() if not k.startswith(LEFTOVERS)}


def _assert_usable(root: Path, manifest: dict[str, object] | None = None) -> DatasetInfo:
    """The manifest loads, is ``manifest`` if given, and every split file it names verifies."""
    info = DatasetInfo.load(root)
    if manifest is not None:
        assert info.manifest == _json(manifest)
    for split in info.manifest["splits"].values():
        if split["samples"]:
            assert sha256_file(root / split["file"]) == split["sha256"], split["file"]
    return info


def test_mistyped_overwrite_keeps_the_dataset(tmp_path: Path, ray_local: None) -> None:
    """The issue's case: ``source.path=<typo> --overwrite`` fails naming the path and leaves
    the dataset byte-identical; an --overwrite while another preprocess holds the output
    touches nothing either."""
    src = _images(tmp_path / "src")
    out = tmp_path / "out"
    manifest = run(_cfg(out, src), echo=False)
    before = _files(out)

    typo = tmp_path / "scr"
    with pytest.raises(PreprocessError, match=re.escape(str(typo)) + ".* is not a directory"):
        run(_cfg(out, typo), overwrite=True, echo=False)
    assert _files(out) == before
    _assert_usable(out, manifest)

    with open(out / ".lock", "w") as held:  # another preprocess is writing here
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(PreprocessError, match="another simgraph preprocess"):
            run(_cfg(out, src, image={"max_side": 10, "min_side": 8}), overwrite=True,
                echo=False)
    assert _files(out) == before
    _assert_usable(out, manifest)


def test_failed_overwrite_keeps_the_dataset_and_a_rerun_resumes_and_swaps(
    tmp_path: Path, ray_local: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _images(tmp_path / "src")
    out = tmp_path / "out"
    old = run(_cfg(out, src, val=0.25), echo=False)
    assert old["splits"]["val"]["samples"] and (out / "val.beton").exists()
    before = _files(out)

    new_cfg = _cfg(out, src)  # other parameters: no val split, so val.beton must go
    with monkeypatch.context() as m:
        def fail(*args: object, **kwargs: object) -> None:
            raise PreprocessError("injected: the merge failed")

        m.setattr(driver, "merge_splits", fail)  # where _build looks it up
        with pytest.raises(PreprocessError, match="injected"):
            run(new_cfg, overwrite=True, echo=False)
    assert _dataset(out) == before
    _assert_usable(out, old)
    # The failed build's finished shards wait in the staging dir, marked with its parameters.
    sidecars = {p.name: p.stat().st_mtime_ns for p in (out / NEXT / "shards").glob("*.json")}
    assert len(sidecars) == 4
    mark = json.loads((out / NEXT / STAGE_MARK).read_text())
    assert mark["params_digest"] != old["params_digest"]

    # still refused without --overwrite, still intact; the refusal names what differs
    with pytest.raises(PreprocessError,
                       match=r"other parameters \(split\.val: 0\.25 -> 0\.0\).*--overwrite"):
        run(new_cfg, echo=False)
    assert _dataset(out) == before

    new = run(new_cfg, overwrite=True, echo=False)
    assert new["params_digest"] == mark["params_digest"] != old["params_digest"]
    info = _assert_usable(out, new)
    assert info.splits == {"train": 8, "val": 0, "test": 0}
    assert not (out / "val.beton").exists()
    assert not [n for n in LEFTOVERS if (out / n).exists()]
    # Resumed: the shards written before the failure were reused, not rewritten.
    assert {p.name: p.stat().st_mtime_ns for p in (out / "shards").glob("*.json")} == sidecars


def _faulty(after: int) -> tuple[list[int], Callable[[Path, Path], None]]:
    """A :func:`transaction._move` that makes ``after`` moves, then raises (as a kill would
    stop)."""
    done = [0]
    real = transaction._move

    def move(src: Path, dst: Path) -> None:
        if done[0] == after:
            raise OSError("injected: killed mid-swap")
        real(src, dst)
        done[0] += 1

    return done, move


def _assert_consistent(root: Path, manifests: list[dict[str, object]]) -> None:
    """No manifest, or one of ``manifests`` whose split files are all there and verify."""
    if (root / MANIFEST).exists():
        _assert_usable(root)
        assert DatasetInfo.load(root).manifest in _json(manifests)  # type: ignore[operator]


def test_interrupted_swap_is_finished_or_rolled_back(
    tmp_path: Path, ray_local: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kill the swap after every possible number of renames (and after the last one, before
    its clean-up): a reader never sees a manifest naming missing or other files, and the next
    run finishes the swap, or, when the new build does not verify, puts the old dataset back
    (killed in turn after every number of its renames, the run after it finishes that)."""
    src = _images(tmp_path / "src")
    a_cfg, b_cfg = _cfg(tmp_path / "a", src, val=0.25), _cfg(tmp_path / "b", src)
    a, b = run(a_cfg, echo=False), run(b_cfg, echo=False)
    a_files, b_files = _dataset(tmp_path / "a"), _dataset(tmp_path / "b")

    def prepared(name: str) -> Path:
        """Dataset a with b, complete, in its staging dir: the state a swap starts from."""
        out = tmp_path / name
        ignore = shutil.ignore_patterns(".lock")
        shutil.copytree(tmp_path / "a", out, ignore=ignore)
        shutil.copytree(tmp_path / "b", out / NEXT, ignore=ignore)
        return out

    counted, counting = _faulty(-1)  # never fails: counts the renames of a whole swap
    monkeypatch.setattr(transaction, "_move", counting)
    transaction._swap(prepared("whole"))
    entries = [{p.name for p in (tmp_path / d).iterdir() if p.name != ".lock"} for d in "ab"]
    assert counted[0] == sum(map(len, entries))  # every old entry aside, every new one in
    assert _dataset(tmp_path / "whole") == b_files
    _assert_usable(tmp_path / "whole", b)

    def killed_before_cleanup(out: Path) -> None:
        raise OSError("injected: killed before the clean-up")

    for k in [*range(counted[0]), "cleanup"]:
        for outcome in ("finish", "roll back"):
            out = prepared(f"{outcome}-{k}")
            with monkeypatch.context() as m:
                if k == "cleanup":
                    m.setattr(transaction, "_discard_swap", killed_before_cleanup)
                else:
                    m.setattr(transaction, "_move", _faulty(int(k))[1])
                with pytest.raises(OSError, match="injected"):
                    transaction._swap(out)
            assert (out / SWAP_JOURNAL).exists(), (outcome, k)
            _assert_consistent(out, [a, b])

            if outcome == "finish":  # the next run, whatever it is asked, finishes the swap
                got = run(_at(b_cfg, out), echo=False)
                assert got == _json(b) and _dataset(out) == b_files, k
                assert not (out / NEXT).exists()
            else:  # the new build is damaged: the next run restores the old dataset
                staged = out / NEXT / "train.beton"
                with open(staged if staged.exists() else out / "train.beton", "ab") as f:
                    f.write(b"damaged")
                for j in itertools.count():  # ... even when it is killed while doing that
                    with monkeypatch.context() as m:
                        m.setattr(transaction, "_move", _faulty(j)[1])
                        try:
                            got = run(_at(a_cfg, out), echo=False)
                            break
                        except OSError:
                            pass
                    if (k, j) != ("cleanup", 0):  # (that one's manifest is b: damaged above)
                        _assert_consistent(out, [a, b])
                assert got == _json(a) and _dataset(out) == a_files, k
                assert (out / NEXT / MANIFEST).exists()  # back in staging, resumable
            _assert_usable(out, got)
            assert not (out / PREVIOUS).exists() and not (out / SWAP_JOURNAL).exists()


def _at(cfg: PreprocessConfig, out: Path) -> PreprocessConfig:
    return dataclasses.replace(cfg, output=str(out))


def _remote(uri: str) -> dict[str, bytes]:
    from components.io import storage

    return {name: storage.read_bytes(storage.join(uri, name))
            for name in storage.list_dir(uri) if not storage.is_dir(storage.join(uri, name))}


def test_uri_output_is_compared_with_the_remote_manifest(
    tmp_path: Path, ray_local: None, s3_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built from another host (an empty build cache), other parameters are refused without
    --overwrite; a mistyped --overwrite leaves the remote dataset as it was; a good one
    replaces it, manifest last, and deletes the files the new dataset does not have."""
    from components.data.staging import stage_dataset
    from components.io import storage

    src = _images(tmp_path / "src")
    uri = storage.join(s3_uri, "datasets", "pets")
    monkeypatch.setenv("SIMGRAPH_STAGE_DIR", str(tmp_path / "host1"))
    old = run(_cfg(Path("unused"), src, val=0.25, output=uri), echo=False)
    before = _remote(uri)
    assert "val.beton" in before and json.loads(before[MANIFEST]) == _json(old)

    monkeypatch.setenv("SIMGRAPH_STAGE_DIR", str(tmp_path / "host2"))
    new_cfg = _cfg(Path("unused"), src, output=uri)
    with pytest.raises(PreprocessError,
                       match=re.escape(storage.display(uri)) + r".*other parameters "
                       r"\(split\.val: 0\.25 -> 0\.0\).*--overwrite"):
        run(new_cfg, echo=False)
    typo = tmp_path / "scr"
    with pytest.raises(PreprocessError, match=re.escape(str(typo))):
        run(_cfg(Path("unused"), typo, output=uri), overwrite=True, echo=False)
    assert _remote(uri) == before

    new = run(new_cfg, overwrite=True, echo=False)
    after = _remote(uri)
    assert json.loads(after[MANIFEST]) == _json(new)
    assert new["params_digest"] != old["params_digest"]
    assert "val.beton" not in after  # the replaced dataset's file the new one lacks is gone
    info = DatasetInfo.load(stage_dataset(uri, tmp_path / "stage"))
    assert info.splits == {"train": 8, "val": 0, "test": 0}


KILL_SWAP = """
import os, signal, sys
from pathlib import Path
from components.data.build import transaction
real, done = transaction._move, [0]
def move(src, dst):
    if done[0] == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)  # no finally, no atexit: as `kill -9`
    real(src, dst)
    done[0] += 1
transaction._move = move
transaction._swap(Path(sys.argv[1]))
"""


def test_sigkilled_swap_is_finished_by_the_next_run(tmp_path: Path, ray_local: None) -> None:
    """A real SIGKILL of the preprocess process mid-swap (while the old entries go aside, and
    while the new ones come in): a reader sees the old or the new dataset, never a mix, and
    the next run finishes the swap."""
    import subprocess
    import sys

    src = _images(tmp_path / "src")
    a_cfg, b_cfg = _cfg(tmp_path / "a", src, val=0.25), _cfg(tmp_path / "b", src)
    a, b = run(a_cfg, echo=False), run(b_cfg, echo=False)
    b_files = _dataset(tmp_path / "b")
    moves = len([p for p in (tmp_path / "a").iterdir() if p.name != ".lock"])
    for k in (1, moves + 1):  # phase 1 (old entries aside), phase 2 (new entries in)
        out = tmp_path / f"killed-{k}"
        shutil.copytree(tmp_path / "a", out, ignore=shutil.ignore_patterns(".lock"))
        shutil.copytree(tmp_path / "b", out / NEXT, ignore=shutil.ignore_patterns(".lock"))
        proc = subprocess.run([sys.executable, "-c", KILL_SWAP, str(out), str(k)],
                              cwd=Path(__file__).parents[2], capture_output=True, text=True)
        assert proc.returncode == -9, proc.stderr
        assert (out / SWAP_JOURNAL).exists()
        _assert_consistent(out, [a, b])
        got = run(_at(b_cfg, out), echo=False)
        assert got == _json(b) and _dataset(out) == b_files, k
        assert not (out / NEXT).exists() and not (out / PREVIOUS).exists()
        _assert_usable(out, got)

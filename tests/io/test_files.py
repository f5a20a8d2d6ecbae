"""components.io.files: whole-or-nothing writes and file hashes."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from components.io.files import (
    atomic_open,
    remove_temporaries,
    replacing,
    sha256_file,
    temporary_sibling,
    write_json,
    write_text,
)


def test_replacing_publishes_on_success_and_keeps_the_old_file_on_failure(
        tmp_path: Path) -> None:
    target = tmp_path / "sub" / "state.bin"  # parent created
    with replacing(target) as tmp:
        assert tmp.parent == target.parent and tmp != target
        tmp.write_bytes(b"one")
        assert not target.exists()  # nothing under the final name until the block ends
    assert target.read_bytes() == b"one"
    with pytest.raises(RuntimeError, match="killed"), replacing(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"one"
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.bin"]  # tmp removed


def test_temporary_keeps_the_suffix_numpy_would_otherwise_append(tmp_path: Path) -> None:
    for name, save in (("a.npy", np.save), ("b.npz", np.savez)):
        with replacing(tmp_path / name) as tmp:
            save(tmp, np.arange(3))
        assert (tmp_path / name).exists()
    assert np.array_equal(np.load(tmp_path / "a.npy"), np.arange(3))
    assert np.array_equal(np.load(tmp_path / "b.npz")["arr_0"], np.arange(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "b.npz"]
    assert temporary_sibling(tmp_path / "x.beton").suffix == ".beton"


def test_atomic_open_text_json_and_modes(tmp_path: Path) -> None:
    with atomic_open(tmp_path / "m.csv", "w", newline="") as f:
        f.write("a,b\r\n")
    assert (tmp_path / "m.csv").read_bytes() == b"a,b\r\n"
    write_text(tmp_path / "t.txt", "héllo")
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "héllo"
    write_json(tmp_path / "j.json", {"k": [1, 2]})
    assert json.loads((tmp_path / "j.json").read_text()) == {"k": [1, 2]}
    for mode in ("a", "r", "r+b", "w+"):
        with pytest.raises(ValueError, match=re.escape(f"mode={mode!r}")), \
                atomic_open(tmp_path / "x", mode):
            pass


def test_remove_temporaries_removes_only_writer_leftovers(tmp_path: Path) -> None:
    keep = ["a.beton", ".lock", "b.tmp", ".hidden.json"]
    for name in keep:
        (tmp_path / name).write_text("x")
    left = [temporary_sibling(tmp_path / "a.beton"), temporary_sibling(tmp_path / "manifest")]
    for p in left:
        p.write_text("partial")
    assert remove_temporaries(tmp_path) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)
    assert remove_temporaries(tmp_path / "missing") == 0


def test_sha256_file_matches_hashlib_across_block_boundaries(tmp_path: Path) -> None:
    data = np.random.default_rng(0).integers(0, 256, 10_007, dtype=np.uint8).tobytes()
    (tmp_path / "f").write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    assert sha256_file(tmp_path / "f") == want
    assert sha256_file(tmp_path / "f", block=1000) == want  # 10 full blocks + a partial one

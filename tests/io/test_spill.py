"""``components/io/spill.py``: bytes appended to an unlinked file and read back mapped equal the
bytes appended (across write chunks), leave nothing in the folder, and are handed on once."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from components.io import spill
from components.io.spill import SpillBuffer, spill_copy


@pytest.mark.parametrize("where", ["memory", "file"])
def test_the_bytes_read_back_are_the_bytes_appended(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spill, "CHUNK", 7)  # many writes, one not on a chunk boundary
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 256, n, dtype=np.uint8) for n in (0, 3, 11, 1, 20)]
    buf = SpillBuffer(None if where == "memory" else tmp_path)
    for p in parts:
        buf.append(p.tobytes() if len(p) % 2 else p)  # bytes and arrays alike
    assert len(buf) == sum(len(p) for p in parts)
    got = buf.array()
    assert got.dtype == np.uint8 and got.tobytes() == b"".join(p.tobytes() for p in parts)
    assert isinstance(got, np.memmap) == (where == "file")
    assert list(tmp_path.iterdir()) == []  # unlinked from the start: nothing to clean up
    if where == "file":
        assert not got.flags.writeable
    with pytest.raises(RuntimeError, match="once"):
        buf.array()
    with pytest.raises(RuntimeError, match="after array"):
        buf.append(b"more")
    assert spill_copy([got, np.frombuffer(b"xyz", np.uint8)], str(tmp_path)).tobytes() == \
        got.tobytes() + b"xyz"


def test_an_empty_buffer_and_a_folder_that_cannot_take_a_file(tmp_path: Path) -> None:
    assert SpillBuffer(tmp_path).array().tobytes() == b""
    missing = tmp_path / "gone"
    with pytest.raises(OSError, match=f"cannot write a scratch file in {missing}"):
        SpillBuffer(missing)


def test_the_map_outlives_the_buffer_and_its_file_descriptor(tmp_path: Path) -> None:
    buf = SpillBuffer(tmp_path)
    buf.append(b"abc" * 1000)
    fds = len(os.listdir("/proc/self/fd"))
    got = buf.array()
    del buf
    assert got[:6].tobytes() == b"abcabc" and len(got) == 3000
    assert len(os.listdir("/proc/self/fd")) <= fds  # the file object closed; the map kept

"""Caches keyed on file metadata see a file replaced with its size and mtime kept (issue 39,
principle 4: rsync -t, tar and cp -p restore both): keys hold size, mtime_ns, inode and ctime_ns
(components.io.files.stat_key) — the content pass's ``content.npz`` and the caption model's
export cache."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from components.data.build.hashing import _content_key
from components.data.onnx_text import _model_digest


def _rewrite_keeping_size_and_mtime(path: Path, data: bytes) -> None:
    st = path.stat()
    time.sleep(0.01)  # ctime granularity
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # what rsync -t / tar restore
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_the_content_cache_key_changes_with_same_size_same_mtime_content(tmp_path: Path) -> None:
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    a.write_bytes(b"first image")
    b.write_bytes(b"other image")
    cfg: Any = SimpleNamespace(image=SimpleNamespace(max_side=64, min_side=8))
    paths = [str(a), str(b)]
    key = _content_key(cfg, paths)
    assert _content_key(cfg, paths) == key  # nothing changed: the cache is used
    _rewrite_keeping_size_and_mtime(a, b"FIRST IMAGE")
    assert _content_key(cfg, paths) != key


def test_the_caption_model_cache_key_changes_with_a_replaced_model(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"\x00" * 64)
    key = _model_digest(model, "onnx")
    assert _model_digest(model, "onnx") == key
    _rewrite_keeping_size_and_mtime(model / "weights.bin", b"\x01" * 64)
    assert _model_digest(model, "onnx") != key

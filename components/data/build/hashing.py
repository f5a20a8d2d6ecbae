"""Step 2a: the content pass. Every listed item is decoded as it will be stored and hashed
(``components/data/integrity.py``: sha256 of its bytes and pixels, a pHash, a grey thumbnail),
as Ray tasks (:func:`hash_with_ray`, cached in ``content.npz``) or in this process
(:func:`hash_local`). :mod:`~components.data.build.planning` dedupes and groups by the
resulting :class:`Content`; the pass runs only when :func:`dedupe_enabled`."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from components.config import PreprocessConfig
from components.data import integrity
from components.data.build.source_record import Stat, item_stat
from components.data.build.tasks import _task_count, map_tasks
from components.data.images import ImageError, decode_image
from components.data.sources import read_item, take_paths
from components.io.files import replacing

# A sha256 as its 32 raw bytes (numpy drops trailing NUL bytes when it hands one back, which
# keeps equal digests equal and different ones different: they all have 32 bytes); b"" for an
# item that could not be decoded. Hex strings were 113 B each in memory, 256 B in content.npz.
DIGEST = np.dtype("S32")


def dedupe_enabled(cfg: PreprocessConfig) -> bool:
    return cfg.dedupe.exact or cfg.dedupe.near_threshold is not None


def hash_batch(batch: dict[str, np.ndarray], max_side: int, min_side: int) -> dict[str, Any]:
    """One Ray task of the content pass (and the in-process fallback): decode each item as it
    will be stored and hash it (``integrity.hash_item``); a failure becomes a row with a
    ``reason``."""
    cols: dict[str, list[Any]] = {k: [] for k in (
        "reason", "detail", "bytes_sha256", "pixels_sha256", "phash", "thumb")}
    for path in batch["path"]:
        try:
            data = read_item(str(path))
            rgb = decode_image(data, max_side=max_side, min_side=min_side)
            h = integrity.hash_item(data, rgb)
            row = ["", "", bytes.fromhex(h.bytes_sha256), bytes.fromhex(h.pixels_sha256),
                   h.phash, h.thumb]
        except (ImageError, OSError) as e:
            row = [getattr(e, "reason", "unreadable-file"), str(e), b"", b"", 0,
                   bytes(integrity.THUMB**2)]
        for k, v in zip(cols, row, strict=True):
            cols[k].append(v)
    return {
        "idx": batch["idx"],
        **{k: np.array(cols[k], dtype=object) for k in ("reason", "detail")},
        # [n, 256] uint8: one array, not a bytes object per item
        "thumb": np.frombuffer(b"".join(cols["thumb"]), np.uint8).reshape(
            -1, integrity.THUMB**2),
        **{k: np.array(cols[k], dtype=DIGEST) for k in ("bytes_sha256", "pixels_sha256")},
        "phash": np.array(cols["phash"], dtype=np.uint64),
    }


def _shared_strs(values: Iterable[Any]) -> list[str]:
    """``[str(v) for v in values]`` with one str object per distinct value (nearly every item's
    reason and detail is ``""``: a list of pointers to it, not a str per item)."""
    table: dict[str, str] = {}
    return [table.setdefault(s, s) for s in map(str, values)]


@dataclasses.dataclass(kw_only=True)
class Content:
    """Per listed item: its decode failure (``reason`` non-empty) or its hashes (see
    :mod:`components.data.integrity`)."""

    reason: list[str]
    detail: list[str]
    bytes_sha256: np.ndarray  # [n] DIGEST: sha256 of the file's bytes
    pixels_sha256: np.ndarray  # [n] DIGEST: sha256 of the stored pixels (shape + bytes)
    phash: np.ndarray  # [n] uint64
    thumbs: np.ndarray  # [n, 256] uint8

    @classmethod
    def from_columns(cls, cols: dict[str, Any]) -> Content:
        idx = np.asarray(cols["idx"], dtype=np.int64)
        # the tasks' rows come back in order (then no column is copied to reorder it)
        order: np.ndarray | slice = (slice(None) if bool(np.all(idx[1:] > idx[:-1]))
                                     else np.argsort(idx, kind="stable"))
        thumbs = np.asarray(cols["thumb"])
        if thumbs.dtype == object:  # bytes per item (an older task's form)
            thumbs = np.frombuffer(b"".join(thumbs), np.uint8)
        return cls(
            reason=_shared_strs(np.asarray(cols["reason"])[order]),
            detail=_shared_strs(np.asarray(cols["detail"])[order]),
            bytes_sha256=np.asarray(cols["bytes_sha256"], dtype=DIGEST)[order],
            pixels_sha256=np.asarray(cols["pixels_sha256"], dtype=DIGEST)[order],
            phash=np.asarray(cols["phash"], dtype=np.uint64)[order],
            thumbs=thumbs.reshape(len(idx), integrity.THUMB**2)[order],
        )


def hash_local(cfg: PreprocessConfig, paths: Sequence[str]) -> Content:
    """The content pass in this process (small sources, unit tests)."""
    batch = {"idx": np.arange(len(paths)), "path": np.array(list(paths), object)}
    return Content.from_columns(hash_batch(batch, cfg.image.max_side, cfg.image.min_side))


def _stat_of(paths: Sequence[str], cache: dict[str, Stat], i: int) -> Stat:
    return item_stat(paths[i], cache)


HASH_VERSION = "sha256+phash64+thumb16/2"  # /2: raw digests


def _content_key(cfg: PreprocessConfig, paths: Sequence[str],
                 stat: Callable[[int], Stat] | None = None) -> str:
    """The cache key of the content pass over the items ``paths``: their paths and file
    metadata (``stat``: an item's index -> its :func:`item_stat`, e.g. ``SourceRecord.stat_at``
    of the listing being built; default: stat each file now).

    sha256 of ``json.dumps({"hash": ..., "image": [max_side, min_side], "items": [[path,
    *stat], ...]}, sort_keys=True)`` — fed to the hash piece by piece (one item's JSON at a
    time), never built as one text: the keys of existing ``content.npz`` files stay valid
    (tests/data/test_cache_keys.py's golden value)."""
    if stat is None:
        cache: dict[str, Stat] = {}
        stat = functools.partial(_stat_of, paths, cache)
    h = hashlib.sha256()
    h.update(('{"hash": ' + json.dumps(HASH_VERSION) + ', "image": '
              + json.dumps([cfg.image.max_side, cfg.image.min_side]) + ', "items": [').encode())
    buf: list[str] = []
    for n, path in enumerate(paths):
        buf.append((", " if n else "") + json.dumps([path, *(stat(n) or (None,) * 4)]))
        if len(buf) >= 4096:
            h.update("".join(buf).encode())
            buf.clear()
    h.update(("".join(buf) + "]}").encode())
    return h.hexdigest()


def hash_with_ray(cfg: PreprocessConfig, paths: Sequence[str], out: Path,
                  stat: Callable[[int], Stat] | None = None) -> Content:
    """The content pass as Ray tasks of about ``ITEMS_PER_TASK`` items (:func:`map_tasks`);
    cached in ``content.npz`` (keyed by the items' paths and
    :func:`~components.io.files.stat_key`: size, mtime_ns, inode, ctime_ns; ``stat`` as in
    :func:`_content_key`), so a resumed run does not hash again."""
    cache = out / "content.npz"
    key = _content_key(cfg, paths, stat)
    if cache.exists():
        with np.load(cache, allow_pickle=False) as z:
            if str(z["key"]) == key:
                return Content(reason=_shared_strs(z["reason"]),
                               detail=_shared_strs(z["detail"]),
                               bytes_sha256=z["bytes_sha256"].astype(DIGEST),
                               pixels_sha256=z["pixels_sha256"].astype(DIGEST),
                               phash=z["phash"].copy(), thumbs=z["thumbs"].copy())
    bounds = np.linspace(0, len(paths), _task_count(len(paths)) + 1).astype(int)
    # each task's paths as columns with its own few shard prefixes (no str per item here)
    batches = [{"idx": np.arange(a, b), "path": take_paths(paths, np.arange(a, b), True)}
               for a, b in itertools.pairwise(bounds) if b > a]
    parts = map_tasks(hash_batch, batches, max_side=cfg.image.max_side,
                      min_side=cfg.image.min_side)
    content = Content.from_columns({k: np.concatenate([part[k] for part in parts])
                                    for k in parts[0]})
    with replacing(cache) as tmp:
        np.savez(tmp, key=np.array(key), reason=np.array(content.reason, dtype=str),
                 detail=np.array(content.detail, dtype=str),
                 bytes_sha256=content.bytes_sha256, pixels_sha256=content.pixels_sha256,
                 phash=content.phash, thumbs=content.thumbs)
    return content

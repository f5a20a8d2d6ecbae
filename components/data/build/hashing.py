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
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from components.config import PreprocessConfig
from components.data import integrity
from components.data.build.placement import ANYWHERE, Placement
from components.data.build.source_record import Stat, _chunks, item_stat
from components.data.build.tasks import _task_count, iter_tasks
from components.data.images import ImageError, decode_image
from components.data.shard_paths import take_paths
from components.data.sources import read_item
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
    """Per listed item: its hashes (see :mod:`components.data.integrity`), and the items that
    could not be decoded. Collected by a build (:func:`collect`, or read back from
    ``content.npz``), the digests and thumbnails are that file's pages, memory-mapped: the
    driver holds the pHashes (8 B an item) and the failures."""

    failed: np.ndarray  # [k] int64, ascending: the items that could not be decoded
    reason: list[str]  # [k] each failure's skip reason
    detail: list[str]  # [k] its message
    bytes_sha256: np.ndarray  # [n] DIGEST: sha256 of the file's bytes (b"": failed)
    pixels_sha256: np.ndarray  # [n] DIGEST: sha256 of the stored pixels (shape + bytes)
    phash: np.ndarray  # [n] uint64
    thumbs: np.ndarray  # [n, 256] uint8

    def failures(self) -> Iterator[tuple[int, str, str]]:
        """``(item, reason, detail)`` of each item that could not be decoded, in item order."""
        return zip(self.failed.tolist(), self.reason, self.detail, strict=True)

    @classmethod
    def from_columns(cls, cols: dict[str, Any]) -> Content:
        idx = np.asarray(cols["idx"], dtype=np.int64)
        # the tasks' rows come back in order (then no column is copied to reorder it)
        order: np.ndarray | slice = (slice(None) if bool(np.all(idx[1:] > idx[:-1]))
                                     else np.argsort(idx, kind="stable"))
        thumbs = np.asarray(cols["thumb"])
        if thumbs.dtype == object:  # bytes per item (an older task's form)
            thumbs = np.frombuffer(b"".join(thumbs), np.uint8)
        reason = np.asarray(cols["reason"])[order]
        failed = np.flatnonzero(reason != "")
        return cls(
            failed=failed.astype(np.int64),
            reason=_shared_strs(reason[failed]),
            detail=_shared_strs(np.asarray(cols["detail"])[order][failed]),
            bytes_sha256=np.asarray(cols["bytes_sha256"], dtype=DIGEST)[order],
            pixels_sha256=np.asarray(cols["pixels_sha256"], dtype=DIGEST)[order],
            phash=np.asarray(cols["phash"], dtype=np.uint64)[order],
            thumbs=thumbs.reshape(len(idx), integrity.THUMB**2)[order],
        )

    @classmethod
    def read(cls, cache: Path, key: str | None = None) -> Content | None:
        """The content stored in ``cache`` (``content.npz``), its digests and thumbnails
        mapped; ``None`` when ``key`` is given and the file was stored under another."""
        with np.load(cache, allow_pickle=False) as z:
            if key is not None and ("key" not in z.files or str(z["key"]) != key):
                return None
            failed = z["failed"].astype(np.int64)
            reason, detail = _shared_strs(z["failed_reason"]), _shared_strs(z["failed_detail"])
            phash = z["phash"].astype(np.uint64)
        return cls(failed=failed, reason=reason, detail=detail, phash=phash,
                   **{k: npz_member(cache, k) for k in MAPPED})


def hash_local(cfg: PreprocessConfig, paths: Sequence[str]) -> Content:
    """The content pass in this process (small sources, unit tests)."""
    batch = {"idx": np.arange(len(paths)), "path": np.array(list(paths), object)}
    return Content.from_columns(hash_batch(batch, cfg.image.max_side, cfg.image.min_side))


def _stat_of(paths: Sequence[str], cache: dict[str, Stat], i: int) -> Stat:
    return item_stat(paths[i], cache)


HASH_VERSION = "sha256+phash64+thumb16/3"  # /2: raw digests; /3: failures sparse


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
    item_stat_of = stat

    def pieces() -> Iterator[str]:
        yield ('{"hash": ' + json.dumps(HASH_VERSION) + ', "image": '
               + json.dumps([cfg.image.max_side, cfg.image.min_side]) + ', "items": [')
        for n, path in enumerate(paths):
            yield (", " if n else "") + json.dumps([path, *(item_stat_of(n) or (None,) * 4)])
        yield "]}"

    h = hashlib.sha256()
    for chunk in _chunks(pieces()):
        h.update(chunk)
    return h.hexdigest()


def hash_with_ray(cfg: PreprocessConfig, paths: Sequence[str], out: Path,
                  stat: Callable[[int], Stat] | None = None,
                  placement: Placement = ANYWHERE) -> Content:
    """The content pass as Ray tasks of about ``ITEMS_PER_TASK`` items (:func:`iter_tasks`);
    cached in ``content.npz`` (keyed by the items' paths and
    :func:`~components.io.files.stat_key`: size, mtime_ns, inode, ctime_ns; ``stat`` as in
    :func:`_content_key`), so a resumed run does not hash again. The thumbnails and digests
    (320 B an item) are read from that file, memory-mapped, not held (:func:`collect`)."""
    cache = out / CONTENT_FILE
    key = _content_key(cfg, paths, stat)
    cached = Content.read(cache, key) if cache.exists() else None
    if cached is not None:
        return cached
    bounds = np.linspace(0, len(paths), _task_count(len(paths), placement) + 1).astype(int)
    # each task's paths as columns with its own few shard prefixes (no str per item here)
    batches = [{"idx": np.arange(a, b), "path": take_paths(paths, np.arange(a, b), True)}
               for a, b in itertools.pairwise(bounds) if b > a]
    parts = iter_tasks(hash_batch, batches, placement=placement, max_side=cfg.image.max_side,
                       min_side=cfg.image.min_side)
    return collect(parts, len(paths), cache, key)


CONTENT_FILE = "content.npz"


# content.npz's per-item columns of fixed width that a build reads from the file (mapped), not
# the heap: name -> (the content task's column, dtype, one item's shape). [n, 256] uint8
# thumbnails (the near-duplicate check touches its candidates' pages), [n] DIGEST digests (the
# exact-duplicate check streams them).
MAPPED: dict[str, tuple[str, np.dtype[Any], tuple[int, ...]]] = {
    "bytes_sha256": ("bytes_sha256", DIGEST, ()),
    "pixels_sha256": ("pixels_sha256", DIGEST, ()),
    "thumbs": ("thumb", np.dtype(np.uint8), (integrity.THUMB**2,)),
}


def collect(parts: Iterable[dict[str, Any]], n: int, cache: Path, key: str) -> Content:
    """The content of ``n`` items from the content tasks' ``parts`` (:func:`hash_batch`'s
    columns, any order), each stored as it arrives and let go: the thumbnails and digests
    written to scratch files beside ``cache`` (``pwrite``, not mapped: their pages are not the
    driver's), the pHashes into an array, the failures (few) into lists. ``cache``
    (``content.npz``, the layout ``np.savez`` writes, keyed by ``key``) is written from them
    column by column (:func:`_save_npz`), and :data:`MAPPED` columns are then mapped from it
    read-only (:func:`npz_member`): the driver holds ~8 B an item, not 320."""
    width = {k: dtype.itemsize * math.prod(shape) for k, (_, dtype, shape) in MAPPED.items()}
    scratch = {k: cache.with_name(f"{cache.name}.{k}") for k in MAPPED}
    fds: dict[str, int] = {}
    try:
        for k, path in scratch.items():
            fds[k] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            os.ftruncate(fds[k], n * width[k])
        phash = np.zeros(n, dtype=np.uint64)
        failed: dict[int, tuple[str, str]] = {}
        shared: dict[str, str] = {}
        for part in parts:
            idx = np.asarray(part["idx"], dtype=np.int64)
            phash[idx] = part["phash"]
            for k, (column, dtype, _) in MAPPED.items():
                _pwrite_rows(fds[k], np.ascontiguousarray(part[column], dtype=dtype), idx,
                             width[k])
            for j in np.flatnonzero(np.asarray(part["reason"]) != "").tolist():
                r, d = str(part["reason"][j]), str(part["detail"][j])
                failed[int(idx[j])] = (shared.setdefault(r, r), shared.setdefault(d, d))
            del part
        at = np.array(sorted(failed), dtype=np.int64)
        reason = [failed[i][0] for i in at.tolist()]
        detail = [failed[i][1] for i in at.tolist()]
        with replacing(cache) as tmp:
            _save_npz(tmp, {
                "key": np.array(key), "failed": at, "failed_reason": reason,
                "failed_detail": detail, "phash": phash,
                **{k: _FileRows(fds[k], (n, *shape), dtype)
                   for k, (_, dtype, shape) in MAPPED.items()}})
    finally:
        for fd in fds.values():
            os.close(fd)
        for path in scratch.values():
            path.unlink(missing_ok=True)
    return Content(failed=at, reason=reason, detail=detail, phash=phash,
                   **{k: npz_member(cache, k) for k in MAPPED})


def _pwrite_rows(fd: int, rows: np.ndarray, idx: np.ndarray, width: int) -> None:
    """Write ``rows`` (``width`` bytes each) at rows ``idx`` of the file ``fd``: written, not
    mapped, so the pages do not count in the driver's RSS."""
    if len(idx) and bool(np.all(np.diff(idx) == 1)):
        os.pwrite(fd, rows.data.cast("B"), int(idx[0]) * width)
        return
    for i, row in zip(idx.tolist(), rows, strict=True):
        os.pwrite(fd, np.ascontiguousarray(row).tobytes(), i * width)


class _FileRows:
    """An array of ``shape`` and ``dtype`` stored in an open file, read (not mapped) a slice
    of rows at a time: what :func:`_save_npz` copies into ``content.npz``."""

    def __init__(self, fd: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self.fd, self.shape, self.dtype = fd, shape, dtype
        self.row = dtype.itemsize * int(np.prod(shape[1:]))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: slice) -> np.ndarray:
        a, b, _ = rows.indices(self.shape[0])
        data = os.pread(self.fd, (b - a) * self.row, a * self.row)
        return np.frombuffer(data, self.dtype).reshape(-1, *self.shape[1:])


def _save_npz(path: Path, arrays: dict[str, np.ndarray | list[str] | _FileRows]) -> None:
    """``np.savez(path, **arrays)``'s file (uncompressed members ``<name>.npy``), written a
    chunk of rows at a time: a list of str is stored as the ``<U`` array ``np.array(values,
    dtype=str)`` would be (its widest value's width) without building it for every row."""
    import zipfile

    chunk = 1 << 20  # bytes (two chunks may be alive at once: ~2 MiB)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, values in arrays.items():
            shape: tuple[int, ...]
            if isinstance(values, list):
                width = max((len(v) for v in values), default=0)
                dtype, shape = np.dtype(f"<U{max(width, 1)}"), (len(values),)
            else:
                dtype, shape = values.dtype, values.shape
            header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                      "shape": shape}
            with zf.open(name + ".npy", "w", force_zip64=True) as f:
                f.write(_npy_header(header))
                if not shape or not len(values):
                    if not isinstance(values, list):
                        f.write(np.ascontiguousarray(values).tobytes())
                    continue
                row = max(1, dtype.itemsize * int(np.prod(shape[1:])))
                step = max(1, chunk // row)  # rows of ~chunk bytes at a time
                for a in range(0, len(values), step):
                    rows = np.ascontiguousarray(np.asarray(values[a : a + step], dtype=dtype))
                    f.write(rows.data.cast("B"))


def _npy_header(header: dict[str, Any]) -> bytes:
    """The ``.npy`` header of an array (format 1.0, or 2.0 when it does not fit: as
    ``np.lib.format.write_array`` writes it)."""
    import io

    buf = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buf, header)
    except ValueError:
        buf = io.BytesIO()
        np.lib.format.write_array_header_2_0(buf, header)
    return buf.getvalue()


def npz_member(path: Path, name: str) -> np.ndarray:
    """The array ``name`` of the ``.npz`` file ``path``, memory-mapped read-only when it is
    stored uncompressed (as ``np.savez`` and :func:`_save_npz` write it), else loaded."""
    import zipfile

    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(name + ".npy")
    if info.compress_type == zipfile.ZIP_STORED:
        with open(path, "rb") as f:
            f.seek(info.header_offset)
            local = f.read(30)
            start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") + (
                int.from_bytes(local[28:30], "little"))
            f.seek(start)
            version = np.lib.format.read_magic(f)
            read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                    else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read(f)
            offset = f.tell()
        if not fortran and not dtype.hasobject and local[:4] == b"PK\x03\x04":
            if not int(np.prod(shape)):
                return np.zeros(shape, dtype=dtype)
            return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)
    with np.load(path, allow_pickle=False) as z:
        return np.asarray(z[name])

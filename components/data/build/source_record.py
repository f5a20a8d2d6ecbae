"""What a dataset was built from: its source as listed (every kept item's path, label, caption
and file metadata; the classes; the items skipped while listing), so that a re-run of
``preprocess`` knows whether the source still holds what the dataset was built from.

Owner of ``source.json.gz`` in a dataset dir (written before ``manifest.json``, which records
its digest under ``"source"``): :meth:`SourceRecord.of` builds one from a :class:`Listed`,
:meth:`SourceRecord.write` / :meth:`SourceRecord.read` store and load it, and
:meth:`SourceRecord.changes` names what differs between two. :func:`item_stat` is the one
definition of "the file an item is read from, and its metadata", which the content cache
(``hashing._content_key``) and the shard digests (``driver._build``) key on too.

A file's metadata is :func:`components.io.files.stat_key` (size, mtime_ns, inode, ctime_ns):
content replaced with its size and mtime kept (``rsync -t``, ``tar``) is a new inode or ctime,
so it counts as changed. An item read from an object store (``s3://`` in a manifest source) is
compared by its listing only (path, label, caption): its bytes are not looked up, one request
per item being too slow to do at every re-run (docs/reliability.md)."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import itertools
import json
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from components.data.build.common import PreprocessError
from components.data.build.listing import Listed
from components.data.shard_paths import ShardPaths
from components.data.sources import item_file, shard_item
from components.io.files import replacing, stat_key

SOURCE_FILE = "source.json.gz"
_FORMAT = 1
NAMED = 3  # paths named per kind of change in a message

Stat = tuple[int, int, int, int] | None  # stat_key of the file an item is read from, or None


def name_some(paths: Sequence[str]) -> str:
    """Up to :data:`NAMED` of ``paths``, and how many more: a message's list of files."""
    more = f", and {len(paths) - NAMED} more" if len(paths) > NAMED else ""
    return ", ".join(paths[:NAMED]) + more


def _first_rows(paths: ShardPaths) -> np.ndarray:
    """``[files]``: each shard file's first row in ``paths`` (-1: a file with no row)."""
    first = np.full(len(paths.prefixes), -1, dtype=np.int64)
    rows = np.arange(len(paths.file))[::-1]
    first[paths.file[::-1]] = rows
    return first


def item_stat(path: str, cache: dict[str, Stat] | None = None) -> Stat:
    """:func:`components.io.files.stat_key` of the file the item ``path`` is read from; ``None``
    when it is an object-store URI or cannot be stat'ed (a missing file is skipped later, when
    it is read). ``cache``: file -> stat, for sources whose items share a file."""
    local = item_file(path)
    if local is None:
        return None
    if cache is not None and local in cache:
        return cache[local]
    try:
        st: Stat = stat_key(os.stat(local))
    except OSError:
        st = None
    if cache is not None:
        cache[local] = st
    return st


def _chunks(pieces: Iterable[str], size: int = 1 << 16) -> Iterator[bytes]:
    """``pieces`` joined and UTF-8 encoded in chunks of about ``size`` characters (one hash
    update or write per chunk, not per item)."""
    buf: list[str] = []
    held = 0
    for piece in pieces:
        buf.append(piece)
        held += len(piece)
        if held >= size:
            yield "".join(buf).encode()
            buf, held = [], 0
    if buf:
        yield "".join(buf).encode()


def _caption_digest(text: str) -> bytes:
    """The 8 bytes a caption's key is: the first of its UTF-8 text's sha256."""
    return hashlib.sha256(text.encode()).digest()[:8]


def _caption_key(text: str | None) -> str | None:
    return None if text is None else _caption_digest(text).hex()


class CaptionKeys(Sequence[str]):
    """:func:`_caption_key` of each text of a caption table, held as 8 bytes a text (the
    16 hex digits as raw bytes) instead of a str (~73 B with its list slot: 0.9 GB for CC12M's
    12M distinct captions); each key is made back on access."""

    def __init__(self, texts: Iterable[str]) -> None:
        raw = bytearray()  # grown in place: no list of every digest first (as join makes)
        for t in texts:
            raw += _caption_digest(t)
        self._raw = np.frombuffer(raw, np.uint8).reshape(-1, 8)

    def __len__(self) -> int:
        return len(self._raw)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [r.tobytes().hex() for r in self._raw[i]]
        return str(self._raw[i].tobytes().hex())


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceChanges:
    """How a source differs from the one a dataset was built from (paths, sorted)."""

    added: list[str]
    removed: list[str]
    changed: list[str]  # label, caption or file metadata differ
    classes: tuple[list[str], list[str]] | None  # (before, now) when the class list differs
    skipped: tuple[int, int] | None  # (before, now) listing-time skips, when they differ

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.classes or self.skipped)

    def describe(self) -> str:
        """One clause per kind of change, naming up to :data:`NAMED` paths each: a shard
        item by its shard (its path is its place in the shard, ``#tar:<offset>:<size>``,
        which means nothing to a reader, and moves for every later item when one changes)."""
        def some(paths: Sequence[str]) -> str:
            items = [shard_item(p) for p in paths]
            if not items or any(x is None for x in items):
                return name_some(paths)
            return "in " + name_some(list(dict.fromkeys(x[0] for x in items if x is not None)))

        parts = [f"{len(v)} {k} ({some(v)})" for k, v in
                 (("added", self.added), ("removed", self.removed),
                  ("changed", self.changed)) if v]
        if self.classes:
            parts.append(f"classes {self.classes[0]} -> {self.classes[1]}")
        if self.skipped:
            parts.append(f"items skipped while listing {self.skipped[0]} -> {self.skipped[1]}")
        return "; ".join(parts)


class SourceRecord:
    """The source as a build listed it: ``classes``; per item its path, label, caption key and
    stat; ``skipped``: path -> reason (items skipped while listing: a missing caption, ...).

    Held as columns, aligned with the :class:`Listed` it was made from (:meth:`stat_at`: item
    ``i``'s stat): a shard source's items share their shard's one stat and path prefix, so the
    record holds ~10 B an item, not a tuple and a str. ``items`` (path -> (label, caption
    key, stat)) is built on demand, for :meth:`changes` and tests."""

    def __init__(self, classes: list[str],
                 items: Mapping[str, tuple[int, str | None, Stat]] | None = None,
                 skipped: Mapping[str, str] | None = None, *,
                 paths: Sequence[str] | None = None, labels: np.ndarray | None = None,
                 caption_keys: Sequence[str | None] | None = None,
                 caption_ids: np.ndarray | None = None, stats: list[Stat] | None = None,
                 stat_ids: np.ndarray | None = None) -> None:
        self.classes = classes
        self.skipped: Mapping[str, str] = skipped or {}
        self._items: dict[str, tuple[int, str | None, Stat]] | None = None
        self._digest: str | None = None
        if items is not None:  # a mapping (read back, tests): one column entry per item
            self._items = dict(items)
            vals = list(self._items.values())
            paths, labels = list(self._items), np.array([v[0] for v in vals], np.int64)
            caption_keys = [v[1] for v in vals]
            caption_ids = np.arange(len(vals), dtype=np.int64)
            stats, stat_ids = [v[2] for v in vals], np.arange(len(vals), dtype=np.int64)
        self.paths: Sequence[str] = paths if paths is not None else []
        self.labels = labels if labels is not None else np.zeros(0, np.int64)
        self.caption_keys = caption_keys or []
        self.caption_ids = caption_ids if caption_ids is not None else np.zeros(0, np.int64)
        self.stats = stats or []
        self.stat_ids = stat_ids if stat_ids is not None else np.zeros(0, np.int64)

    @classmethod
    def of(cls, listed: Listed) -> SourceRecord:
        """The record of ``listed``: each item's file stat'ed once (a shard: once for all of
        its items)."""
        paths = listed.paths
        stat_ids: np.ndarray
        if isinstance(paths, ShardPaths):
            stats = [None if k < 0 else item_stat(paths[int(k)])
                     for k in _first_rows(paths).tolist()]
            stat_ids = paths.file
        else:
            cache: dict[str, Stat] = {}
            stats = [item_stat(p, cache) for p in paths]
            stat_ids = np.arange(len(stats), dtype=np.int64)
        return cls(list(listed.classes), None, {s.path: s.reason for s in listed.skipped},
                   paths=paths, labels=listed.labels,
                   caption_keys=CaptionKeys(listed.captions),
                   caption_ids=listed.caption_ids, stats=stats, stat_ids=stat_ids)

    def __len__(self) -> int:
        return len(self.labels)

    def changed_files(self, listed: Listed) -> list[str]:
        """The files of ``listed`` (what this record was made of) whose metadata differs now
        from the record's: each stat'ed again and compared as it goes (a shard once for its
        items; no second record of a folder source's millions of stats)."""
        paths = listed.paths
        changed: list[str] = []
        if isinstance(paths, ShardPaths):
            for k, row in enumerate(_first_rows(paths).tolist()):
                if row >= 0 and item_stat(paths[row]) != self.stats[k]:
                    changed.append(item_file(paths[row]) or paths[row])
            return changed
        last: tuple[str | None, Stat] = (None, None)  # items sharing a file come together
        for i, p in enumerate(paths):
            f = item_file(p)
            st = last[1] if f is not None and f == last[0] else item_stat(p)
            last = (f, st)
            if st != self.stat_at(i) and (f or p) not in changed[-1:]:
                changed.append(f or p)
        return changed

    def stat_at(self, i: int) -> Stat:
        """The stat of item ``i`` (its index in the :class:`Listed` the record was made of)."""
        return self.stats[int(self.stat_ids[i])]

    def _entry(self, i: int) -> tuple[int, str | None, Stat]:
        c = int(self.caption_ids[i])
        return int(self.labels[i]), None if c < 0 else self.caption_keys[c], self.stat_at(i)

    @property
    def items(self) -> Mapping[str, tuple[int, str | None, Stat]]:
        """path -> (label, caption key, stat) (built on first use: an object per item)."""
        if self._items is None:
            self._items = {p: self._entry(i) for i, p in enumerate(self.paths)}
        return self._items

    def stat(self, path: str) -> Stat:
        """The recorded stat of the item ``path`` (``None`` when unknown)."""
        entry = self.items.get(path)
        return None if entry is None else entry[2]

    def _sorted(self) -> Iterator[tuple[str, int]]:
        """(path, index) of every item, sorted by path. A shard source's: shard by shard (in
        the order of their path prefixes, when none is a prefix of another: then they order
        the whole paths) and within one by its items' paths — one shard's strs at a time."""
        paths = self.paths
        if isinstance(paths, ShardPaths) and (paths.a >= 0).all():
            order = sorted(range(len(paths.prefixes)), key=paths.prefixes.__getitem__)
            pre = [paths.prefixes[f] for f in order]
            if not any(b.startswith(a) for a, b in itertools.pairwise(pre)):
                by_file = np.argsort(paths.file, kind="stable")
                bounds = np.searchsorted(paths.file[by_file], np.arange(len(pre) + 1))
                for f in order:
                    rows = by_file[bounds[f]:bounds[f + 1]].tolist()
                    yield from sorted((paths[r], r) for r in rows)
                return
        yield from sorted((p, i) for i, p in enumerate(paths))

    def _pieces(self, sort_keys: bool) -> Iterator[str]:
        """The record's canonical JSON text in pieces (one per item, none of them the whole):
        ``{"classes":[...],"format":1,"items":[[path,label,caption key,stat],...],
        "skipped":[[path,reason],...]}`` — keys sorted for the digest, in ``write``'s order
        (format, classes, items, skipped) otherwise; compact separators. Items sorted by path.
        The same text as ``json.dumps`` of the whole record gives (the digests of existing
        dataset dirs stay valid: tests/data/test_streamed_digests.py's golden values)."""
        def dumps(obj: Any) -> str:
            return json.dumps(obj, separators=(",", ":"))

        head = {"format": dumps(_FORMAT), "classes": dumps(self.classes)}
        order = ("classes", "format") if sort_keys else ("format", "classes")
        yield "{" + ",".join(f'"{k}":{head[k]}' for k in order) + ',"items":['
        for n, (path, i) in enumerate(self._sorted()):
            label, key, st = self._entry(i)
            yield ("," if n else "") + dumps([path, label, key, None if st is None else list(st)])
        yield '],"skipped":' + dumps(sorted(self.skipped.items())) + "}"

    def digest(self) -> str:
        """sha256 of the record's canonical JSON (sorted keys, compact): the manifest's
        ``source.digest``; fed to the hash piece by piece, never built as one text (once: a
        build asks several times, and a record does not change)."""
        if self._digest is None:
            h = hashlib.sha256()
            for chunk in _chunks(self._pieces(sort_keys=True)):
                h.update(chunk)
            self._digest = h.hexdigest()
        return self._digest

    def summary(self) -> dict[str, Any]:
        """What the manifest records under ``"source"``."""
        return {"file": SOURCE_FILE, "items": len(self), "digest": self.digest()}

    def write(self, out: Path) -> None:
        """``out/source.json.gz``, atomically (before the manifest that names its digest)."""
        with replacing(out / SOURCE_FILE) as tmp, open(tmp, "wb") as f:
            # zlib's gzip stream (wbits 31, level 9: mtime 0, no file name), fed piece by
            # piece, never as one text: the bytes gzip.compress(text, mtime=0) gave, so a
            # rebuild is byte-identical, to earlier builds' files too
            z = zlib.compressobj(9, zlib.DEFLATED, 31)
            for chunk in _chunks(self._pieces(sort_keys=False)):
                f.write(z.compress(chunk))
            f.write(z.flush())

    @classmethod
    def read(cls, out: Path) -> SourceRecord | None:
        """The record in the dataset dir ``out``; ``None`` when there is none.

        Raises:
            PreprocessError: the file is there but is not a record (damaged, or not
                simgraph's): it names the file and what to do.
        """
        path = out / SOURCE_FILE
        if not path.exists():
            return None
        try:
            with gzip.open(path, "rt", encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, dict) or data.get("format") != _FORMAT:
                raise ValueError("not a source record")
            items = {str(p): (int(label), cap, None if st is None else tuple(st))
                     for p, label, cap, st in data["items"]}
            return cls(list(data["classes"]), items,
                       {str(p): str(r) for p, r in data["skipped"]})
        except (OSError, ValueError, KeyError, TypeError, EOFError) as e:
            raise PreprocessError(
                f"{path} cannot be read as simgraph's source record ({e}); rebuild the "
                "dataset with --overwrite") from None

    def changes(self, now: SourceRecord) -> SourceChanges:
        """What differs in ``now`` (the source listed again) from this record."""
        added = sorted(now.items.keys() - self.items.keys())
        removed = sorted(self.items.keys() - now.items.keys())
        changed = sorted(p for p in self.items.keys() & now.items.keys()
                         if self.items[p] != now.items[p])
        classes = (self.classes, now.classes) if self.classes != now.classes else None
        skipped = ((len(self.skipped), len(now.skipped))
                   if dict(self.skipped) != dict(now.skipped) else None)
        return SourceChanges(added=added, removed=removed, changed=changed, classes=classes,
                             skipped=skipped)


def check_unchanged(out: Path, manifest: Mapping[str, Any], now: SourceRecord) -> bool:
    """Whether the dataset in ``out`` (its ``manifest`` given) records the source it was
    built from: ``True`` when it does and ``now`` (the source listed again) is that source,
    ``False`` when it records none (built before simgraph recorded sources).

    Raises:
        PreprocessError: the source changed since: the message names the added, removed and
            changed items and the fix (``--overwrite`` rebuilds it beside the current
            dataset); or ``source.json.gz`` is damaged or missing while the manifest names it.
    """
    recorded = manifest.get("source")
    if not isinstance(recorded, dict):
        return False
    if recorded.get("digest") == now.digest():
        return True
    before = SourceRecord.read(out)
    what = ("its record is missing" if before is None
            else before.changes(now).describe() or "its record differs")
    raise PreprocessError(
        f"{out} was built from another version of its source: {what}; pass --overwrite to "
        "rebuild it from the source as it is now (built beside the current dataset and "
        "swapped in when complete). Files are compared by size, modification time, inode and "
        "change time, not their bytes: a file copied back or moved away and back counts as "
        "changed too")

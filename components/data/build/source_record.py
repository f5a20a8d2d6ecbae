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
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from components.data.build.common import PreprocessError
from components.data.build.listing import Listed
from components.data.sources import item_file
from components.io.files import replacing, stat_key

SOURCE_FILE = "source.json.gz"
_FORMAT = 1
NAMED = 3  # paths named per kind of change in a message

Stat = tuple[int, int, int, int] | None  # stat_key of the file an item is read from, or None


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


def _caption_key(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()[:16]


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
        """One clause per kind of change, naming up to :data:`NAMED` paths each."""
        def some(paths: Sequence[str]) -> str:
            more = f", and {len(paths) - NAMED} more" if len(paths) > NAMED else ""
            return ", ".join(paths[:NAMED]) + more

        parts = [f"{len(v)} {k} ({some(v)})" for k, v in
                 (("added", self.added), ("removed", self.removed),
                  ("changed", self.changed)) if v]
        if self.classes:
            parts.append(f"classes {self.classes[0]} -> {self.classes[1]}")
        if self.skipped:
            parts.append(f"items skipped while listing {self.skipped[0]} -> {self.skipped[1]}")
        return "; ".join(parts)


@dataclasses.dataclass(frozen=True)
class SourceRecord:
    """The source as a build listed it. ``items``: path -> (label, caption key, stat);
    ``skipped``: path -> reason (items skipped while listing: a missing caption, ...)."""

    classes: list[str]
    items: Mapping[str, tuple[int, str | None, Stat]]
    skipped: Mapping[str, str]

    @classmethod
    def of(cls, listed: Listed) -> SourceRecord:
        cache: dict[str, Stat] = {}
        items = {it.path: (it.label, _caption_key(text), item_stat(it.path, cache))
                 for it, text in zip(listed.items, listed.texts, strict=True)}
        return cls(list(listed.classes), items, {s.path: s.reason for s in listed.skipped})

    def stat(self, path: str) -> Stat:
        """The recorded stat of the item ``path`` (``None`` when unknown)."""
        entry = self.items.get(path)
        return None if entry is None else entry[2]

    def _pieces(self, sort_keys: bool) -> Iterator[str]:
        """The record's canonical JSON text in pieces (one per item, none of them the whole):
        ``{"classes":[...],"format":1,"items":[[path,label,caption key,stat],...],
        "skipped":[[path,reason],...]}`` — keys sorted for the digest, in ``write``'s order
        (format, classes, items, skipped) otherwise; compact separators. Items sorted by path.
        The same text as ``json.dumps`` of the whole record gives (the digests of existing
        dataset dirs stay valid: tests/data/test_source_changes.py's golden values)."""
        def dumps(obj: Any) -> str:
            return json.dumps(obj, separators=(",", ":"))

        head = {"format": dumps(_FORMAT), "classes": dumps(self.classes)}
        order = ("classes", "format") if sort_keys else ("format", "classes")
        yield "{" + ",".join(f'"{k}":{head[k]}' for k in order) + ',"items":['
        for n, path in enumerate(sorted(self.items)):
            v = self.items[path]
            yield ("," if n else "") + dumps([path, v[0], v[1],
                                              None if v[2] is None else list(v[2])])
        yield '],"skipped":' + dumps(sorted(self.skipped.items())) + "}"

    def digest(self) -> str:
        """sha256 of the record's canonical JSON (sorted keys, compact): the manifest's
        ``source.digest``; fed to the hash piece by piece, never built as one text."""
        h = hashlib.sha256()
        for chunk in _chunks(self._pieces(sort_keys=True)):
            h.update(chunk)
        return h.hexdigest()

    def summary(self) -> dict[str, Any]:
        """What the manifest records under ``"source"``."""
        return {"file": SOURCE_FILE, "items": len(self.items), "digest": self.digest()}

    def write(self, out: Path) -> None:
        """``out/source.json.gz``, atomically (before the manifest that names its digest)."""
        with replacing(out / SOURCE_FILE) as tmp, open(tmp, "wb") as raw, gzip.GzipFile(
                filename="", mode="wb", fileobj=raw, mtime=0) as f:
            # mtime 0, no file name: the same source gives the same bytes (a rebuild is
            # byte-identical); written piece by piece, never as one text
            for chunk in _chunks(self._pieces(sort_keys=False)):
                f.write(chunk)

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
        "swapped in when complete), or restore the source")

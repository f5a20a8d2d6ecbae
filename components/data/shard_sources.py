"""WebDataset tar shards and Parquet files as sources (img2dataset's outputs, Hugging Face
Parquet exports), streamed: nothing is unpacked to disk.

Listing (driver) reads only what labels and captions need: a tar shard's 512-byte member
headers (:mod:`components.data.tar_headers`, seeking past the image bytes; ``tarfile`` for a
shard that reader declines) plus its small caption / label members; a Parquet
file's key, caption and label columns, row group by row group — never its image column. Each
item is an addressable path (:data:`components.data.sources.SHARD_ITEM`) that
:func:`read_shard_item` opens lazily inside the Ray stages:

* ``<shard.tar>#tar:<data offset>:<size>`` — seek to the image member's data, read its bytes;
* ``<file.parquet>#parquet:<row group>:<row>:<image column>`` — that row's image cell (the
  last row group read is cached per process: a shard task reads its rows in order).

Shards are local paths or ``s3://`` / ``gs://`` URIs, read through the pyarrow filesystem
:func:`components.data.sources.read_item` uses. ``item_file`` of an item is its shard file, so
a changed shard changes the build's source record like a changed image file does.

Per-item problems are counted :class:`~components.data.sources.Skip` records (or raise
:class:`~components.data.sources.SourceError` with ``bad_input: error``): a key without an
image member (``missing-image``), a duplicate key (``duplicate-path``; first kept), a missing
label (``missing-label``) or one outside ``source.classes`` (``unknown-label``), a shard that
cannot be read as a tar / Parquet file (``unreadable-shard``, one per shard). Captions that are
missing, empty or not UTF-8 are left to ``captions.missing`` like every source's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import tarfile
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import numpy as np

from components.config.preprocess import IMAGE_EXTENSIONS, SourceConfig
from components.data.caption_texts import CaptionReader
from components.data.hf_features import class_label_names, class_label_value, hf_feature
from components.data.integrity import duplicate_rows
from components.data.labels import label_key, label_names, label_problem
from components.data.shard_files import open_shard, packed, shard_files
from components.data.shard_items import MISSING_IMAGE
from components.data.shard_paths import ShardPaths
from components.data.sources import (
    CAPTION_ISSUES,
    DUPLICATE,
    UNKNOWN_LABEL,
    ItemTable,
    Listing,
    Skip,
    SourceError,
    decode_caption,
    shard_item,
)
from components.data.tar_headers import CutShort, tar_members

UNREADABLE_SHARD = "unreadable-shard"
MISSING_LABEL = "missing-label"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardOptions:
    """``source.*`` settings of the webdataset, parquet and huggingface kinds (SourceConfig's
    meanings)."""

    image_extensions: tuple[str, ...] = IMAGE_EXTENSIONS
    caption_key: str = "txt"
    label_key: str | None = None
    image_column: str = "image"
    caption_column: str | None = "caption"
    label_column: str | None = None
    split: tuple[str, ...] | None = None  # huggingface: the DatasetDict splits (None: all)

    @classmethod
    def of(cls, source: SourceConfig) -> ShardOptions:
        """The settings of a ``source`` section."""
        return cls(image_extensions=tuple(source.image_extensions),
                   caption_key=source.caption_key, label_key=source.label_key,
                   image_column=source.image_column, caption_column=source.caption_column,
                   label_column=source.label_column, split=source.splits)


# ---------------------------------------------------------------------------------------------
# Which shard files: a folder, a glob, brace notation; local or s3:// / gs://.


# ---------------------------------------------------------------------------------------------
# Listing.


class _Stop(Exception):  # noqa: N818 (not an error: reading stops at a pending problem)
    """Ends a listing's reading under ``bad_input: error`` (:meth:`_Lister.skip`)."""


class _Lister:
    """Items and skips of one listing, as columns (:class:`ShardPaths`, raw label and caption
    ids into tables of the distinct values, a 16-byte digest of each key): labels stay raw
    values until the class list is known, duplicate keys are found once every shard is read.

    A skip's place among the others is kept (``(rows before it, 0)``; a duplicate key's
    ``(its row, 1)``), so the skips come out in the order the shards were read, as when each
    key was looked up on arrival.

    Under ``bad_input: error`` the first problem found while reading (a missing image, an
    unreadable shard) stops the listing (:class:`_Stop`, caught by :meth:`reading`) and is
    kept as ``pending``; :meth:`table` then raises the first problem in listing order: a
    duplicate key or a label problem among the rows read before it, else that one. A
    duplicate's first copy is always an earlier row, so the rows before the stop hold every
    duplicate that comes first."""

    def __init__(self, source: str, on_bad_input: str, spill: str | None = None) -> None:
        self.source = source
        self.policy = on_bad_input
        self.prefix_ids: dict[tuple[str, str], int] = {}  # (prefix, tail) -> file index
        self.file, self.a, self.b = array("i"), array("q"), array("q")
        self.label_ids: dict[object, int] = {}  # raw label -> index (few distinct)
        self.labels = array("i")
        # the captions' text bytes go to a file in ``spill`` (the build dir), not the heap
        self.caption_reader = CaptionReader(decode_caption, CAPTION_ISSUES, spill)
        self.captions = array("i")  # per row: its caption entry in caption_reader
        self.keys = bytearray()  # 16-byte blake2b of each row's key (zeros: none)
        self.keyed = bytearray()  # 1 where the row has a key
        self.key_text = bytearray()  # the keyed rows' keys, UTF-8, each ended by a NUL
        self.skipped: list[tuple[tuple[int, int], Skip]] = []
        self.labelled = True  # whether labels are read (else every item is unlabelled)
        self.label_setting = ""  # e.g. "source.label_key='cls'": named when no item has one
        self.first_members: list[str] = []  # a tar source's first item's member extensions
        self.pending: Skip | None = None  # bad_input: error: the problem that stopped reading
        # a Hugging Face ClassLabel's names (the default class list), once a file gives them
        self.class_names: list[str] | None = None
        self.names_from = ""
        # the caption column: files that have it; the first without it and its columns
        self.caption_files = 0
        self.caption_absent: tuple[str, str, list[str]] | None = None

    def caption_column(self, column: str | None, names: list[str], file: str) -> str | None:
        """``column`` when the file whose columns are ``names`` has it (else ``None``: its
        items have no caption), counted for :attr:`ItemTable.caption_hint`."""
        if column is None:
            return None
        if column in names:
            self.caption_files += 1
            return column
        if self.caption_absent is None:
            self.caption_absent = (column, file, list(names))
        return None

    def class_label(self, names: list[str] | None, where: str, column: str | None) -> None:
        """The ClassLabel names file ``where`` gives its label ``column`` (``None``: none):
        every file's the same.

        Raises:
            SourceError: names other than an earlier file's.
        """
        if names is None:
            return
        if self.class_names is None:
            self.class_names, self.names_from = names, where
        elif names != self.class_names:
            raise SourceError(f"source.label_column={column!r} is a ClassLabel with other names "
                              f"in {where} ({names}) than in {self.names_from} "
                              f"({self.class_names})")

    def skip(self, path: str, reason: str, detail: str, of: str | None = None,
             at: tuple[int, int] | None = None) -> None:
        """Count a problem found while reading (before the next row); under ``bad_input:
        error`` keep it as ``pending`` and stop reading (:class:`_Stop`)."""
        bad = Skip(path=path, reason=reason, detail=detail, of=of)
        if self.policy == "error":
            self.pending = bad
            raise _Stop
        self.skipped.append((at or (len(self.file), 0), bad))

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Around a lister's loop over its shards: a :class:`_Stop` ends it (the listing
        read so far is what :meth:`table` checks)."""
        with contextlib.suppress(_Stop):
            yield

    def add(self, path: str, key: str | None, label: object, caption: bytes | str | None,
            where: str) -> None:
        """One item: ``path`` is split into its shard's prefix and two numbers
        (:data:`~components.data.sources.SHARD_ITEM`; a path that does not rebuild exactly
        is kept whole). ``where`` (the shard file) is not kept: a duplicate's message names
        the shard its path is in."""
        del where
        shard = shard_item(path)
        prefix, tail, a, b = path, "", -1, -1
        if shard is not None:
            file, kind, na, nb, column = shard
            tail = f":{column}" if kind != "tar" else ""
            if f"{file}#{kind}:{na}:{nb}{tail}" == path:
                prefix, a, b = f"{file}#{kind}:", na, nb
            else:
                tail = ""
        self.file.append(self.prefix_ids.setdefault((prefix, tail), len(self.prefix_ids)))
        self.a.append(a)
        self.b.append(b)
        self.labels.append(self.label_ids.setdefault(label, len(self.label_ids)))
        self.captions.append(self.caption_reader.add(caption))
        if key is None:
            self.keys += bytes(16)
            self.keyed.append(0)
        else:
            raw = key.encode()
            self.keys += hashlib.blake2b(raw, digest_size=16).digest()
            self.keyed.append(1)
            self.key_text += raw.replace(b"\0", b"?") + b"\0"

    def _paths(self) -> ShardPaths:
        pairs = list(self.prefix_ids)
        return ShardPaths([p for p, _ in pairs], [t for _, t in pairs],
                          np.frombuffer(self.file, np.int32), np.frombuffer(self.a, np.int64),
                          np.frombuffer(self.b, np.int64))

    def _duplicates(self, paths: ShardPaths) -> tuple[np.ndarray, Skip | None]:
        """Rows whose key an earlier row has (bool ``[n]``), each a ``duplicate-path`` skip
        naming the first (under ``bad_input: error`` not counted: the first of them is
        returned)."""
        dup = np.zeros(len(self.file), dtype=bool)
        keyed = np.flatnonzero(np.frombuffer(self.keyed, np.uint8))
        # positions among the keyed rows (the order of key_text): later copies, their first
        later, kept = duplicate_rows(np.frombuffer(self.keys, "S16"), rows=keyed)
        if not len(later):
            return dup, None
        files = [p.rpartition("#")[0] for p, _ in self.prefix_ids]  # where: the shard file
        ends = np.flatnonzero(np.frombuffer(self.key_text, np.uint8) == 0)
        begins = np.r_[0, ends[:-1] + 1]
        first: Skip | None = None
        for k, f in zip(later.tolist(), keyed[kept].tolist(), strict=True):
            r = int(keyed[k])
            dup[r] = True
            if self.policy == "error" and first is not None:
                continue  # only the first is named
            key = bytes(self.key_text[begins[k]:ends[k]]).decode()
            where = files[self.file[r]] if self.a[r] >= 0 else paths[r]
            bad = Skip(path=paths[r], reason=DUPLICATE, detail=f"key {key!r} listed more "
                       f"than once ({where}); first kept", of=paths[f])
            if self.policy == "error":
                first = bad
            else:
                self.skipped.append(((r, 1), bad))
        return dup, first

    def table(self, classes: Sequence[str] | None, labelled: bool | None = None) -> ItemTable:
        """The kept items as columns (duplicates and label problems skipped and counted);
        ``labelled``: default ``self.labelled``.

        Raises:
            SourceError: no items; or under ``bad_input: error`` the first problem in listing
                order (a duplicate key, a missing / unknown label, or what stopped reading).
        """
        labelled = self.labelled if labelled is None else labelled
        paths = self._paths()
        dup, first_dup = self._duplicates(paths)
        raw = list(self.label_ids)
        rows = np.frombuffer(self.labels, np.int32)
        used = np.unique(rows[~dup]).tolist() if labelled else []  # a duplicate's label: none
        names, index = label_names([raw[i] for i in used], classes or self.class_names)
        if labelled:
            # raw label id -> class index; -2: no label, -3: not a class
            to = np.array([-2 if lab is None else index.get(label_key(lab), -3)
                           for lab in raw], dtype=np.int32)
            labels = to[rows] if len(raw) else rows.copy()
        else:
            names, labels = [], np.full(len(rows), -1, dtype=np.int32)
        skipped = [s for _, s in sorted(self.skipped, key=lambda x: x[0])]
        label_rows = np.flatnonzero((labels < -1) & ~dup)
        if self.policy == "error":
            # the first problem in listing order: the first duplicate or label problem among
            # the rows read (all before the pending problem, if any), else the pending one
            # (without source.classes, the classes are the labels of the rows read)
            first = first_dup
            first_dup_row = int(np.argmax(dup)) if first_dup is not None else len(dup)
            if len(label_rows) and label_rows[0] < first_dup_row:
                first = self._label_skip(paths, raw, rows, names, index, int(label_rows[0]))
            first = first or self.pending
            if first is not None:
                raise SourceError(f"{first.path}: {first.detail} (set bad_input=skip to skip "
                                  "and count such items)")
        none = "no label"
        if labelled and len(label_rows) and bool(np.all(labels[~dup] == -2)) and \
                self.label_setting:  # not one item has a label: the setting, not the items
            members = (f" (the first item's members: .{', .'.join(self.first_members)})"
                       if self.first_members else "")
            none = f"no label: {self.label_setting} gives none for any item{members}"
        skipped += [self._label_skip(paths, raw, rows, names, index, r, none)
                    for r in label_rows.tolist()]
        keep = np.flatnonzero((labels >= -1) & ~dup)
        # each row's caption entry -> its text and issue (CaptionReader: no str per caption,
        # no dict of every raw value)
        captions, tid, issue = self.caption_reader.finish()
        cap = np.frombuffer(self.captions, np.int32)[keep]
        table = ItemTable(
            paths=paths.take(keep), labels=labels[keep],
            caption_ids=tid[cap] if len(tid) else cap.copy(),
            captions=captions,
            caption_issues=issue[cap] if len(issue) else cap.astype(np.int8),
            official=None, groups=None, classes=names, skipped=skipped)
        if self.caption_absent is not None and not self.caption_files:
            column, file, names_ = self.caption_absent
            table.caption_hint = (f"no file has a column {column!r} ({file} has "
                                  f"{', '.join(map(repr, names_))})")
        if not len(table) and not skipped:
            raise SourceError(f"source.path={self.source!r} holds no items")
        return table

    @staticmethod
    def _label_skip(paths: ShardPaths, raw: list[object], rows: np.ndarray, names: list[str],
                    index: dict[int | str, int], r: int, none: str = "no label") -> Skip:
        """Row ``r``'s ``missing-label`` / ``unknown-label`` skip (``none``: the detail of a
        missing one)."""
        lab = raw[int(rows[r])]
        if lab is None:
            return Skip(path=paths[r], reason=MISSING_LABEL, detail=none)
        return Skip(path=paths[r], reason=UNKNOWN_LABEL, detail=label_problem(lab, names, index))

    def listing(self, classes: Sequence[str] | None, labelled: bool) -> Listing:
        table = self.table(classes, labelled)
        return Listing(table.items(), table.classes, table.skipped)


def _split_member(name: str) -> tuple[str, str]:
    """WebDataset's ``(key, extension)`` of a member name: the extension starts at the first
    dot of the base name (``a/b.seg.png`` -> ``a/b``, ``seg.png``)."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


class _Member(Protocol):
    """A regular-file member of a tar shard: a ``tarfile.TarInfo``, or a
    :class:`~components.data.tar_headers.TarMember` read from its header."""

    @property
    def name(self) -> str: ...

    @property
    def offset_data(self) -> int: ...

    @property
    def size(self) -> int: ...


_M = TypeVar("_M", bound=_Member)


def _member_ext(choice: str) -> tuple[str, str | None]:
    """The member extension a ``caption_key`` / ``label_key`` reads (``txt``; ``json`` for
    ``json:<field>``) and the JSON field (``None``: the member's bytes)."""
    field = choice[5:] if choice.startswith("json:") else None
    return ("json" if field is not None else choice.lower()), field


def _member_value(read: Callable[[_M], bytes | None], members: dict[str, _M],
                  choice: str) -> bytes | str | int | None:
    """A member's bytes (``txt``, ``cls``) or a field of the ``.json`` member
    (``json:<field>``); ``None`` when there is none (``read``: a member's bytes)."""
    ext, field = _member_ext(choice)
    member = members.get(ext)
    data = read(member) if member is not None else None
    if data is None:
        return None
    if field is None:
        return data
    try:
        value = json.loads(data).get(field)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str | int) and not isinstance(value, bool) else None


def _tar_label(raw: bytes | str | int | None) -> object:
    """A label from a member (text: a class name, or an index when all digits) or a JSON
    field (a string name or an integer index)."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8-sig").strip()
        except UnicodeDecodeError:
            return None
        if not raw:
            return None
        return int(raw) if raw.isdecimal() else raw
    return raw


def _tar_keys(files: Iterable[tuple[str, _M]]) -> Iterator[tuple[str, dict[str, _M]]]:
    """``(key, {extension: member})`` of a shard's samples, in order, from its regular-file
    members ``(name, member)``: consecutive members sharing a key, as WebDataset groups them
    (a key seen again later, or an extension repeated, starts another sample: a duplicate
    key)."""
    key: str | None = None
    members: dict[str, _M] = {}
    for name, m in files:
        k, ext = _split_member(name)
        if k != key or ext in members:
            if key is not None:
                yield key, members
            key, members = k, {}
        members[ext] = m
    if key is not None:
        yield key, members


def list_webdataset(path: str, *, classes: Sequence[str] | None = None,
                    on_bad_input: str = "skip", options: ShardOptions) -> Listing:
    """WebDataset tar shards as :class:`Item` objects (:func:`webdataset_lister`; the build
    lists them as columns).

    Raises:
        SourceError: no shard matched, no items, or a bad item under ``bad_input: error``.
    """
    return webdataset_lister(path, on_bad_input=on_bad_input, options=options).listing(
        classes, options.label_key is not None)


def webdataset_lister(path: str, *, on_bad_input: str = "skip", options: ShardOptions,
                      read_headers: bool = True, spill: str | None = None) -> _Lister:
    """WebDataset tar shards (img2dataset's output): one item per key with an image member
    (the first of ``options.image_extensions``), its caption and label from the members
    ``options`` names. Keys are listed in shard order, then member order. A shard's members
    are read from their 512-byte headers (:mod:`components.data.tar_headers`; any shard that
    reader declines, and every shard with ``read_headers=False``, through ``tarfile``: the
    same listing either way). ``spill``: a directory for the captions' text bytes
    (:class:`~components.data.caption_texts.CaptionReader`; None: held in memory).

    Raises:
        SourceError: no shard matched (no items, or a bad item under ``bad_input: error``:
            :meth:`_Lister.table`).
    """
    exts = [e.lower() for e in options.image_extensions]
    lister = _Lister(path, on_bad_input, spill)
    with lister.reading():
        for shard in shard_files(path, ".tar"):
            before = len(lister.labels)
            try:
                _list_tar(lister, shard, exts, options, read_headers)
            except (OSError, tarfile.TarError, EOFError) as e:
                listed = len(lister.labels) - before
                kept = (f"; its first {listed} items were listed, the rest of the shard is "
                        "lost" if listed else "")
                lister.skip(shard, UNREADABLE_SHARD,
                            f"not a readable uncompressed tar shard: {e}{kept}")
    lister.labelled = options.label_key is not None
    lister.label_setting = f"source.label_key={options.label_key!r}"
    return lister


def _list_tar(lister: _Lister, shard: str, exts: list[str], options: ShardOptions,
              read_headers: bool) -> None:
    """One tar shard's items into ``lister`` (``exts``: the image extensions, lower case):
    its members from their headers (:func:`~components.data.tar_headers.tar_members`), or
    through ``tarfile`` where that reader declines the shard or ``read_headers`` is off."""
    wanted = frozenset(_member_ext(c)[0] for c in (options.caption_key, options.label_key)
                       if c is not None)
    with open_shard(shard) as f:
        why = packed(f)
        if why is not None:
            lister.skip(shard, UNREADABLE_SHARD, why)
            return
        try:
            members = tar_members(f, wanted) if read_headers else None
        except CutShort as e:  # the whole members before the cut listed, the shard named
            _add_samples(lister, shard, exts, options,
                         _tar_keys((m.name, m) for m in e.members), lambda m: m.data)
            raise
        if members is not None:
            _add_samples(lister, shard, exts, options,
                         _tar_keys((m.name, m) for m in members), lambda m: m.data)
            return
        f.seek(0)
        with tarfile.open(fileobj=f, mode="r:") as tf:
            def read(m: tarfile.TarInfo) -> bytes | None:
                x = tf.extractfile(m)
                return None if x is None else x.read()

            _add_samples(lister, shard, exts, options,
                         _tar_keys((m.name, m) for m in tf if m.isfile()), read)
            size = f.seek(0, 2)
            if tf.offset >= size:  # no end-of-archive block after the last member
                raise CutShort(size, [])


def _add_samples(lister: _Lister, shard: str, exts: list[str], options: ShardOptions,
                 samples: Iterator[tuple[str, dict[str, _M]]],
                 read: Callable[[_M], bytes | None]) -> None:
    for key, members in samples:
        if not lister.first_members:
            lister.first_members = sorted(members)
        image = next((members[e] for e in exts if e in members), None)
        if image is None:
            lister.skip(f"{shard}#{key}", MISSING_IMAGE,
                        f"key {key!r} has no image member (.{', .'.join(exts)}); "
                        f"it has {sorted(members)}")
            continue
        label = (None if options.label_key is None
                 else _tar_label(_member_value(read, members, options.label_key)))
        caption = _member_value(read, members, options.caption_key)
        lister.add(f"{shard}#tar:{image.offset_data}:{image.size}", key, label,
                   None if isinstance(caption, int) else caption, shard)


def image_type_problem(schema: Any, column: str) -> str | None:
    """Why ``column`` of a Parquet schema cannot hold image bytes (``None``: it can)."""
    import pyarrow as pa

    if column not in schema.names:
        return f"has no column {column!r} (it has {schema.names}): set source.image_column"
    t = schema.field(column).type
    if pa.types.is_struct(t):
        names = [t.field(i).name for i in range(t.num_fields)]
        if "bytes" not in names:
            return f"column {column!r} is a struct without a 'bytes' field ({names})"
        t = t.field("bytes").type
    if not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        return f"column {column!r} holds {t}, not image bytes (binary or struct{{bytes}})"
    return None


def list_parquet(path: str, *, classes: Sequence[str] | None = None,
                 on_bad_input: str = "skip", options: ShardOptions) -> Listing:
    """Parquet files as :class:`Item` objects (:func:`parquet_lister`; the build lists them as
    columns).

    Raises:
        SourceError: no file matched, no items, or a bad item under ``bad_input: error``.
    """
    return parquet_lister(path, on_bad_input=on_bad_input, options=options).listing(
        classes, options.label_column is not None)


def parquet_lister(path: str, *, on_bad_input: str = "skip", options: ShardOptions,
                   spill: str | None = None) -> _Lister:
    """Parquet files with an image-bytes column and optional caption / label columns; a
    ``key`` column (img2dataset writes one), when present, finds duplicate keys. Rows are
    listed file by file, row group by row group, reading no image bytes. ``spill``: as
    :func:`webdataset_lister`'s.

    Raises:
        SourceError: no file matched (no items, or a bad item under ``bad_input: error``:
            :meth:`_Lister.table`).
    """
    lister = _Lister(path, on_bad_input, spill)
    column = quote(options.image_column, safe="")
    with lister.reading():
        for file in shard_files(path, ".parquet"):
            try:
                _list_parquet_file(lister, file, column, options)
            except (OSError, ValueError, EOFError) as e:  # ArrowInvalid is a ValueError
                lister.skip(file, UNREADABLE_SHARD, f"not a readable Parquet file: {e}")
    lister.labelled = options.label_column is not None
    lister.label_setting = f"source.label_column={options.label_column!r}"
    return lister


def _list_parquet_file(lister: _Lister, file: str, column: str, options: ShardOptions) -> None:
    """One Parquet file's rows into ``lister`` (``column``: the image column, %-quoted)."""
    import pyarrow.parquet as pq

    with open_shard(file) as f:
        why = packed(f)
        if why is not None:
            lister.skip(file, UNREADABLE_SHARD, why)
            return
        pf = pq.ParquetFile(f)
        schema = pf.schema_arrow
        problem = image_type_problem(schema, options.image_column)
        if problem is not None:
            lister.skip(file, UNREADABLE_SHARD, problem)
            return
        cap = lister.caption_column(options.caption_column, schema.names, file)
        label = options.label_column
        if label is not None and label not in schema.names:
            lister.skip(file, UNREADABLE_SHARD, f"has no column {label!r} (it has "
                        f"{schema.names}): set source.label_column")
            return
        # a Hugging Face export's ClassLabel: its names are the classes, cells their indices
        names = class_label_names(hf_feature(schema, label))
        lister.class_label(names, file, label)
        wanted = [c for c in ("key", cap, label) if c is not None and c in schema.names]
        for rg in range(pf.num_row_groups):
            n = pf.metadata.row_group(rg).num_rows
            cols = pf.read_row_group(rg, columns=wanted).to_pydict() if wanted else {}
            keys = cols.get("key")
            for row in range(n):
                path = f"{file}#parquet:{rg}:{row}:{column}"
                raw = cols[label][row] if label else None
                if names is not None:
                    raw, problem = class_label_value(raw, names)
                    if problem is not None:
                        lister.skip(path, UNKNOWN_LABEL, problem)
                        continue
                lister.add(path, None if keys is None or keys[row] is None else str(keys[row]),
                           raw, cols[cap][row] if cap is not None else None, file)

"""Where images come from: a class-folder tree, a manifest file, WebDataset tar shards or
Parquet files (:mod:`components.data.shard_sources`), a Hugging Face ``save_to_disk`` folder
(:mod:`components.data.hf_source`), or a built-in dataset.

Each source lists its items on the driver (paths, labels, captions: cheap) and the Ray Data
stages later read each item's bytes with :func:`read_item`. Problems found while listing
(duplicate paths, labels outside the class list, missing caption files) are returned as
:class:`Skip` records so they are counted in ``manifest.json`` — or raised, with
``on_bad_input="error"``.

Built-ins read Debian packages in place (nothing is downloaded):

* ``fashion-mnist`` — ``dataset-fashion-mnist``: 60k train + 10k test, 10 classes, official split.
* ``tuxpaint`` — ``tuxpaint-stamps-default``: PNG stamps, the category is the top-level folder,
  the caption is the first (English) line of the stamp's ``.txt`` file.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from components.config.preprocess import SOURCE_KINDS, SourceKind
from components.data.labels import label_key, label_names, label_problem
from components.data.shard_paths import take_column, take_paths
from components.errors import SimgraphError

if TYPE_CHECKING:
    from components.data.shard_sources import ShardOptions

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
TUXPAINT_DIR = "/usr/share/tuxpaint/stamps"
FASHION_MNIST_CLASSES = [
    "T-shirt/top", "trouser", "pullover", "dress", "coat",
    "sandal", "shirt", "sneaker", "bag", "ankle boot",
]  # fmt: skip
BUILTIN_PACKAGES = {"fashion-mnist": "dataset-fashion-mnist", "tuxpaint": "tuxpaint-stamps-default"}
FASHION_SCHEME = "fashion-mnist://"

# Listing-time skip reasons (decode-time ones live in components.data.images).
DUPLICATE = "duplicate-path"
UNKNOWN_LABEL = "unknown-label"
MISSING_CAPTION = "missing-caption"
MISSING_FILE = "missing-file"
UNSUPPORTED_URI = "unsupported-uri"
# A class folder that is a symlink out of the source root (to / it would walk the whole disk):
# not listed (counted), nor walked.
SYMLINK_OUT = "symlink-outside-source"  # a path with a scheme no reader here handles (http://)
# Caption checks: a caption file or value that is not valid UTF-8, or empty / whitespace only.
# Such an item is treated like one without a caption (``captions.missing`` decides), and
# counted under this reason instead of missing-caption.
CAPTION_ENCODING = "caption-encoding"
CAPTION_EMPTY = "caption-empty"


class SourceError(SimgraphError, ValueError):
    """The source cannot be listed at all (missing package, unreadable manifest, no items)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Item:
    path: str
    label: int = -1  # index into Listing.classes; -1 = unlabelled
    caption: str | None = None
    official_split: str | None = None  # "train" / "test" when the source defines one
    group: str | None = None  # split.group_by value: items sharing it go to one split
    caption_issue: str | None = None  # CAPTION_ENCODING / CAPTION_EMPTY (then caption is None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Skip:
    path: str
    reason: str
    detail: str
    of: str | None = None  # duplicate-of: the kept copy


def skip_record(s: Skip) -> dict[str, str]:
    """A skip as listed in manifest.json (``of`` only for duplicates)."""
    d = {"path": s.path, "reason": s.reason, "detail": s.detail}
    if s.of is not None:
        d["of"] = s.of
    return d


@dataclasses.dataclass
class Listing:
    items: list[Item]
    classes: list[str]
    skipped: list[Skip]


CAPTION_ISSUES = (None, CAPTION_ENCODING, CAPTION_EMPTY)  # ItemTable.caption_issues' codes


@dataclasses.dataclass(kw_only=True)
class ItemTable:
    """A listing as columns (what the build works from): ``n`` items, no object per item for
    a shard source (:class:`ShardPaths`; a folder / manifest / built-in source keeps a list of
    path strs and, where it has them, official splits and groups)."""

    paths: Sequence[str]  # [n]: a list of str, or ShardPaths
    labels: np.ndarray  # [n] int32; -1 = unlabelled
    caption_ids: np.ndarray  # [n] int32 into captions; -1 = no caption
    captions: Sequence[str]  # the unique caption texts (a shard source's: CaptionTexts)
    caption_issues: np.ndarray  # [n] int8: index into CAPTION_ISSUES
    official: Sequence[str | None] | None  # [n] official split (a list, or a CodedColumn),
    # or None when no item has one
    groups: list[str | None] | None  # [n] split.group_by value, or None without group_by
    classes: list[str]
    skipped: list[Skip]
    # why the source's caption setting gave no item a caption, where the listing can tell
    # (a Parquet / Arrow caption column in no file: the columns they have)
    caption_hint: str | None = None

    @classmethod
    def of(cls, listing: Listing) -> ItemTable:
        """The columns of a listing of :class:`Item` objects."""
        its = listing.items
        index: dict[str, int] = {}
        cids = [-1 if it.caption is None else index.setdefault(it.caption, len(index))
                for it in its]
        official = [it.official_split for it in its]
        groups = [it.group for it in its]
        return cls(paths=[it.path for it in its],
                   labels=np.array([it.label for it in its], dtype=np.int32),
                   caption_ids=np.array(cids, dtype=np.int32), captions=list(index),
                   caption_issues=np.array([CAPTION_ISSUES.index(it.caption_issue)
                                            for it in its], dtype=np.int8),
                   official=official if any(o is not None for o in official) else None,
                   groups=groups if any(g is not None for g in groups) else None,
                   classes=listing.classes, skipped=listing.skipped)

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, idx: np.ndarray) -> ItemTable:
        """The items ``idx`` (int64 indices, in that order); the caption table is shared."""
        il = idx.tolist()
        return dataclasses.replace(
            self, paths=take_paths(self.paths, idx), labels=self.labels[idx],
            caption_ids=self.caption_ids[idx], caption_issues=self.caption_issues[idx],
            official=None if self.official is None else take_column(self.official, idx),
            groups=None if self.groups is None else [self.groups[i] for i in il])

    def items(self) -> list[Item]:
        """The items as :class:`Item` objects (the public ``list_*`` functions' form)."""
        return [Item(path=p, label=int(lab),
                     caption=None if c < 0 else self.captions[c],
                     official_split=None if self.official is None else self.official[i],
                     group=None if self.groups is None else self.groups[i],
                     caption_issue=CAPTION_ISSUES[k])
                for i, (p, lab, c, k) in enumerate(zip(
                    self.paths, self.labels.tolist(), self.caption_ids.tolist(),
                    self.caption_issues.tolist(), strict=True))]


IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm"}


def _note(
    skipped: list[Skip], policy: str, path: str, reason: str, detail: str
) -> None:
    if policy == "error":
        raise SourceError(f"{path}: {detail} (set bad_input=skip to skip and count such items)")
    skipped.append(Skip(path=path, reason=reason, detail=detail))


def _dedupe(items: list[Item], skipped: list[Skip], policy: str) -> list[Item]:
    seen: set[str] = set()
    out = []
    for it in items:
        key = os.path.normpath(it.path) if "://" not in it.path else it.path
        if key in seen:
            _note(skipped, policy, it.path, DUPLICATE, "listed more than once; first kept")
            continue
        seen.add(key)
        out.append(it)
    return out


def _check_classes(classes: Sequence[str] | None, found: Sequence[str]) -> list[str]:
    return list(classes) if classes else sorted(set(found))


def folder_label(rel_dir: Sequence[str], depth: int) -> str | None:
    """The class of an item whose folder, relative to the source root, is ``rel_dir``: its
    first ``depth`` folder names joined by ``/`` (``animals/birds`` at depth 2); an item
    fewer folders deep takes what there is (``medical``). ``None`` at the root."""
    return "/".join(rel_dir[:depth]) if rel_dir else None


def list_folder(
    root: str, classes: Sequence[str] | None = None, on_bad_input: str = "skip",
    label_depth: int = 1,
) -> Listing:
    """``root/<class>/**/<file>``: one class per top-level sub-folder, or with ``label_depth``
    d > 1 one per folder d levels down (:func:`folder_label`: ``root/animals/birds/x.png`` is
    ``animals/birds`` at depth 2), so ``evaluate --labels depth:1`` can score the same run
    against the top-level groups.

    A ``name.txt`` next to ``name.<image suffix>`` is that image's caption. Every other file is
    an item; files that are not images are skipped (counted) at decode time.
    """
    base = Path(root)
    if not base.is_dir():
        raise SourceError(f"source.path={root!r} is not a directory")
    class_dirs = sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))
    skipped: list[Skip] = []
    # rglob does not follow symlinks below a class folder; a class folder that is one is
    # followed only if it stays inside the source root.
    real = base.resolve()
    for p in [p for p in class_dirs if p.is_symlink()]:
        target = p.resolve()
        if target == real or (real not in target.parents):
            class_dirs.remove(p)
            _note(skipped, on_bad_input, str(p), SYMLINK_OUT,
                  f"a symlink to {target} outside source.path (or to it); not followed: "
                  "copy or link the images themselves under source.path")
    if not class_dirs:
        raise SourceError(f"source.path={root!r} has no class sub-folders (root/<class>/<image>)")
    files: list[tuple[Path, str]] = []  # (file, its class name)
    present: set[Path] = set()  # every file found: the caption lookup needs no second stat
    for cdir in class_dirs:
        # Sorted by parts: Path's own order, without its slow __lt__ (24k files: 0.7 s).
        found = sorted((p for p in cdir.rglob("*") if p.is_file() and not p.name.startswith(".")),
                       key=lambda p: p.parts)
        present.update(found)
        stems_with_image = {p.with_suffix("") for p in found if p.suffix.lower() in IMAGE_SUFFIXES}
        for f in found:
            if f.suffix.lower() == ".txt" and f.with_suffix("") in stems_with_image:
                continue  # a caption sidecar
            files.append((f, folder_label(f.parent.relative_to(base).parts, label_depth) or ""))
    # Depth 1 keeps an empty class folder as a class (its name is the folder's).
    names = _check_classes(classes, [p.name for p in class_dirs] if label_depth == 1
                           else [name for _, name in files])
    index = {n: i for i, n in enumerate(names)}
    items: list[Item] = []
    for f, name in files:
        if name not in index:
            _note(skipped, on_bad_input, str(f), UNKNOWN_LABEL,
                  f"class folder {name!r} is not in source.classes")
            continue
        cap_file = f.with_suffix(".txt")
        caption, issue = (
            _caption_file(cap_file) if cap_file in present and cap_file != f else (None, None))
        items.append(Item(path=str(f), label=index[name], caption=caption, caption_issue=issue))
    return Listing(items, names, skipped)


def decode_caption(raw: bytes | str | None,
                   first_line: bool = False) -> tuple[str | None, str | None]:
    """``(text, issue)``: a caption decoded as strict UTF-8 (a BOM is dropped), stripped;
    ``issue`` is :data:`CAPTION_ENCODING` or :data:`CAPTION_EMPTY` when there is no usable
    text. ``None`` (no caption at all) gives ``(None, None)``.

    A caption value (a shard's ``.txt`` member or JSON field, a column's cell) is the whole
    text, its non-empty lines joined by one space: a web caption's line break is part of it,
    not where it ends. ``first_line``: a sidecar ``.txt`` file beside an image gives its first
    non-empty line only (Tux Paint's stamp files put translations on the lines after it)."""
    if raw is None:
        return None, None
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            return None, CAPTION_ENCODING
    text = raw.strip()
    if not text:
        return None, CAPTION_EMPTY
    if "\n" in text or "\r" in text:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        text = lines[0] if first_line else " ".join(lines)
    return text, None


def _caption_file(path: Path) -> tuple[str | None, str | None]:
    return decode_caption(path.read_bytes(), first_line=True)


def list_manifest(
    path: str, classes: Sequence[str] | None = None, on_bad_input: str = "skip",
    group_by: str | None = None,
) -> Listing:
    """A CSV, Parquet or JSONL table with ``path`` and optional ``label`` / ``caption``.

    Relative paths are relative to the manifest's folder; a URI whose scheme cannot be read
    (``http://``: only local paths and ``s3://`` / ``gs://`` / ``file://``) is a counted skip
    (``unsupported-uri``) under ``bad_input: skip``. Labels may be class names (strings)
    or indices; with ``classes`` given, anything outside it is an unknown label. CSV captions
    are read as bytes and decoded per row (strict UTF-8), so one bad row is counted, not fatal.
    ``group_by``: a column whose value (any type, ``null`` = no group) becomes ``Item.group``.
    """
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson
    import pyarrow.parquet as pq

    from components.io.storage import SCHEMES

    p = Path(path)
    if not p.is_file():
        raise SourceError(f"source.path={path!r} does not exist")
    suffix = p.suffix.lower()
    try:
        if suffix == ".csv":
            table = pcsv.read_csv(p, convert_options=pcsv.ConvertOptions(
                column_types={"caption": pa.binary()}))
        elif suffix == ".parquet":
            table = pq.read_table(p)
        elif suffix in (".jsonl", ".json"):
            table = pjson.read_json(p)
        else:
            raise SourceError(
                f"source.path={path!r}: manifest must end in .csv, .parquet or .jsonl"
            )
    except SourceError:
        raise
    except Exception as e:  # pyarrow raises ArrowInvalid & co.
        raise SourceError(f"cannot read manifest {path!r}: {e}") from None
    cols = table.column_names
    if "path" not in cols:
        raise SourceError(f"manifest {path!r} has columns {cols}; a 'path' column is required")
    if group_by is not None and group_by not in cols:
        raise SourceError(
            f"split.group_by={group_by!r}: manifest {path!r} has no such column (it has {cols})"
        )
    rows = table.to_pylist()
    skipped: list[Skip] = []
    seen: set[str] = set()  # bad_input: error: a duplicate is named at its row (_dedupe's key)
    raw_labels = [r.get("label") for r in rows] if "label" in cols else [None] * len(rows)
    names, to_index = label_names(raw_labels, classes)
    items = []
    for row, lab in zip(rows, raw_labels, strict=True):
        rel = row["path"]
        if not isinstance(rel, str) or not rel:
            _note(skipped, on_bad_input, repr(rel), MISSING_FILE, "empty or non-text path")
            continue
        full = rel if ("://" in rel or os.path.isabs(rel)) else str(p.parent / rel)
        scheme = full.split("://", 1)[0].lower() if "://" in full else None
        if scheme is not None and scheme not in SCHEMES:  # what read_item can open
            _note(skipped, on_bad_input, full, UNSUPPORTED_URI,
                  f"{scheme}:// cannot be read: paths may be local or "
                  f"{', '.join(s + '://' for s in SCHEMES)} URIs (download the file "
                  "and list its local path)")
            continue
        label = -1
        if lab is not None:
            key = label_key(lab)
            if key not in to_index:
                _note(skipped, on_bad_input, full, UNKNOWN_LABEL,
                      label_problem(lab, names, to_index))
                continue
            label = to_index[key]
        cap = row.get("caption")
        text, issue = decode_caption(cap if isinstance(cap, bytes | str) else None)
        group = row.get(group_by) if group_by is not None else None
        if on_bad_input == "error":  # the first problem in row order, as skip counts them
            key = os.path.normpath(full) if "://" not in full else full
            if key in seen:
                _note(skipped, on_bad_input, full, DUPLICATE, "listed more than once; first kept")
            seen.add(key)
        items.append(Item(path=full, label=label, caption=text,
                          group=None if group is None else str(group), caption_issue=issue))
    return Listing(_dedupe(items, skipped, on_bad_input), names, skipped)


def _require_package(kind: str, path: str) -> None:
    if not os.path.isdir(path):
        pkg = BUILTIN_PACKAGES[kind]
        raise SourceError(
            f"built-in source {kind!r} needs the Debian package {pkg} (not found at {path}); "
            f"install it with: apt-get install {pkg}"
        )


def list_fashion_mnist(root: str = FASHION_MNIST_DIR) -> Listing:
    _require_package("fashion-mnist", root)
    items = []
    for split, prefix in (("train", "train"), ("test", "t10k")):
        labels = _idx_labels(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz"))
        items += [
            Item(path=f"{FASHION_SCHEME}{root}#{prefix}/{i}", label=int(y), caption=None,
                 official_split=split)
            for i, y in enumerate(labels)
        ]
    return Listing(items, list(FASHION_MNIST_CLASSES), [])


def list_tuxpaint(root: str = TUXPAINT_DIR, on_bad_input: str = "skip",
                  label_depth: int = 1) -> Listing:
    """Stamps by category: the top-level folder (16 categories), or with ``label_depth`` 2 the
    sub-category (``animals/birds``, ~70 classes, many of them tiny) — :func:`folder_label`."""
    _require_package("tuxpaint", root)
    base = Path(root)
    stamps = []
    for png in sorted(base.rglob("*.png")):
        category = folder_label(png.parent.relative_to(base).parts, label_depth)
        if category is None:
            continue  # a PNG at the top level has no category
        txt = png.with_suffix(".txt")
        caption, issue = _caption_file(txt) if txt.is_file() else (None, None)
        stamps.append((png, category, caption, issue))
    categories = (sorted(p.name for p in base.iterdir() if p.is_dir()) if label_depth == 1
                  else sorted({c for _, c, _, _ in stamps}))
    index = {c: i for i, c in enumerate(categories)}
    items = [Item(path=str(png), label=index[c], caption=caption, caption_issue=issue)
             for png, c, caption, issue in stamps]
    return Listing(items, categories, [])


def list_source(
    kind: SourceKind,
    path: str | None,
    classes: Sequence[str] | None = None,
    on_bad_input: str = "skip",
    group_by: str | None = None,
    label_depth: int = 1,
    shard_options: ShardOptions | None = None,
) -> Listing:
    """Dispatch on ``source.kind``; ``path`` overrides a built-in's install folder;
    ``label_depth``: the folder level that names the class (folder and tuxpaint sources);
    ``shard_options``: the webdataset / parquet / huggingface settings (default: their
    defaults).

    Raises:
        SourceError: the source cannot be listed (the message says why and how to fix it).
    """
    if label_depth != 1 and kind not in ("folder", "tuxpaint"):
        raise SourceError(f"source.label_depth={label_depth} applies to folder and tuxpaint "
                          f"sources, not {kind!r} (its labels are not folders)")
    if kind == "folder":
        return list_folder(_need_path(kind, path), classes, on_bad_input, label_depth)
    if kind == "manifest":
        return list_manifest(_need_path(kind, path), classes, on_bad_input, group_by)
    if kind in ("webdataset", "parquet", "huggingface"):
        from components.data import hf_source, shard_sources

        lister = {"webdataset": shard_sources.list_webdataset,
                  "parquet": shard_sources.list_parquet,
                  "huggingface": hf_source.list_huggingface}[kind]
        return lister(_need_path(kind, path), classes=classes, on_bad_input=on_bad_input,
                      options=shard_options or shard_sources.ShardOptions())
    if kind == "fashion-mnist":
        return list_fashion_mnist(path or FASHION_MNIST_DIR)
    if kind == "tuxpaint":
        return list_tuxpaint(path or TUXPAINT_DIR, on_bad_input, label_depth)
    raise SourceError(f"source.kind={kind!r} is not one of {', '.join(SOURCE_KINDS)}")


def list_source_table(
    kind: SourceKind,
    path: str | None,
    classes: Sequence[str] | None = None,
    on_bad_input: str = "skip",
    group_by: str | None = None,
    label_depth: int = 1,
    shard_options: ShardOptions | None = None,
    spill: str | None = None,
) -> ItemTable:
    """:func:`list_source` as columns: webdataset, Parquet and Hugging Face shards are listed
    straight into them (no :class:`Item` per item); the other kinds' listings are converted.
    ``spill``: a directory the shard kinds keep their captions' text bytes in (a mapped,
    unlinked file; None: in memory).

    Raises:
        SourceError: as :func:`list_source`.
    """
    if kind in ("webdataset", "parquet", "huggingface") and label_depth == 1:
        from components.data import hf_source, shard_sources

        where, options = _need_path(kind, path), shard_options or shard_sources.ShardOptions()
        if kind == "huggingface":
            return hf_source.huggingface_lister(where, on_bad_input=on_bad_input,
                                                options=options, spill=spill).table(classes)
        lister = {"webdataset": shard_sources.webdataset_lister,
                  "parquet": shard_sources.parquet_lister}[kind]
        return lister(where, on_bad_input=on_bad_input, options=options,
                      spill=spill).table(classes)
    return ItemTable.of(list_source(kind, path, classes, on_bad_input, group_by, label_depth,
                                    shard_options))


def _need_path(kind: str, path: str | None) -> str:
    if not path:
        raise SourceError(f"source.kind={kind!r} needs source.path")
    return path


# ---------------------------------------------------------------------------------------------
# Reading one item (runs inside Ray Data tasks).


def _idx_labels(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    return np.frombuffer(data, dtype=np.uint8, offset=8)


@functools.lru_cache(maxsize=4)
def _idx_images(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    n, h, w = (int.from_bytes(data[i : i + 4], "big") for i in (4, 8, 12))
    return np.frombuffer(data, dtype=np.uint8, offset=16).reshape(n, h, w)


# An item inside a shard: ``<shard.tar>#tar:<data offset>:<size>`` (the image member's bytes),
# ``<file.parquet>#parquet:<row group>:<row>:<image column, %-quoted>`` or a Hugging Face data
# file's ``<file.arrow>#arrow:<record batch>:<row>:<image column, %-quoted>``; the shard itself
# a local path or (tar, parquet) an s3:// / gs:// URI (its query string before the ``#``).
SHARD_ITEM = re.compile(r"^(?P<file>.+)#(?P<kind>tar|parquet|arrow):(?P<a>\d+):(?P<b>\d+)"
                        r"(?::(?P<column>[^#:]*))?$")


def shard_item(path: str) -> tuple[str, str, int, int, str] | None:
    """``(shard file or URI, "tar" | "parquet" | "arrow", a, b, column)`` of a shard item's
    ``path`` (:data:`SHARD_ITEM`; ``column`` is ``""`` for tar); ``None`` for any other
    item."""
    m = SHARD_ITEM.match(path) if "#" in path else None
    if m is None or (m["kind"] != "tar") != (m["column"] is not None):
        return None
    return m["file"], m["kind"], int(m["a"]), int(m["b"]), m["column"] or ""


def item_file(path: str) -> str | None:
    """The local file the item ``path`` is read from (a built-in's archive for its
    ``fashion-mnist://`` items: ``<root>#<prefix>/<index>``; the tar / Parquet / Arrow file
    holding a shard item); ``None`` for an object-store URI. What :func:`read_item` opens,
    and what a build's source record stats."""
    shard = shard_item(path)
    if shard is not None:
        return None if "://" in shard[0] else shard[0]
    if path.startswith(FASHION_SCHEME):
        root, _, rest = path[len(FASHION_SCHEME) :].partition("#")
        prefix = rest.partition("/")[0]
        return os.path.join(root, f"{prefix}-images-idx3-ubyte.gz")
    return None if "://" in path else path


def read_item(path: str) -> bytes | np.ndarray:
    """The item's encoded bytes (files, ``s3://``/``gs://`` URIs) or decoded pixels (built-ins).

    Raises:
        FileNotFoundError / OSError: the file cannot be read.
        components.data.images.ImageError: a shard item has no image bytes (missing-image).
    """
    shard = shard_item(path)
    if shard is not None and shard[1] == "arrow":
        from components.data.hf_source import read_arrow_item

        return read_arrow_item(shard[0], shard[2], shard[3], shard[4])
    if shard is not None:
        from components.data.shard_items import read_shard_item

        return read_shard_item(*shard)
    if path.startswith(FASHION_SCHEME):
        return _idx_images(str(item_file(path)))[int(path.rpartition("/")[2])]
    if "://" in path:
        import pyarrow.fs as pafs

        fs, inner = pafs.FileSystem.from_uri(path)
        with fs.open_input_file(inner) as f:
            return bytes(f.readall())
    with open(path, "rb") as f:
        return f.read()

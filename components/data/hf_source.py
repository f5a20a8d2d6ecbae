"""Hugging Face ``datasets`` folders as a source (``source.kind: huggingface``): what
``Dataset.save_to_disk`` writes, or ``DatasetDict.save_to_disk`` (a ``dataset_dict.json`` and
one such folder per split). Read offline, in place; the ``datasets`` package is not needed.

A ``save_to_disk`` folder holds ``state.json`` (``_data_files``: the data files in order),
``dataset_info.json`` (``features``: an ``Image`` feature, ``{"_type": "Image"}``, is stored
as a struct ``{bytes: binary, path: string}``; a ``ClassLabel``, ``{"_type": "ClassLabel",
"names": [...]}``, as int64) and ``data-XXXXX-of-NNNNN.arrow`` files: Arrow IPC *streams* of
record batches. Listing memory-maps each data file and reads its caption / label columns batch
by batch (the image bytes are mapped, never read) into columns, as the webdataset and parquet
kinds (:func:`huggingface_lister`: no object per item); an item's path addresses one image cell,
``<file.arrow>#arrow:<batch>:<row>:<image column, %-quoted>``
(:data:`components.data.sources.SHARD_ITEM`), which :func:`read_arrow_item` reads inside the
Ray stages (the file's batches stay mapped per process: a stream has no index, and mapping it
again costs only its batch headers). ``item_file`` of an item is its data file.

Labels: a ``ClassLabel`` column's names are the class list, in their order (``source.classes``
instead re-orders or narrows them; ``-1``, ``datasets``' "no label", is a missing label); any
other column holds class names (or integer indices) as the parquet kind's. Splits: a
DatasetDict's splits are all read (``source.split``: some of them), in ``dataset_dict.json``'s
order; when both a ``train`` and a ``test`` split are read, their items keep that split
(``Item.official_split``), a published validation split (``validation``, ``valid`` or ``val``)
is val, and only without one is val drawn from train (as for fashion-mnist); otherwise every item
is split by ``split.val`` / ``split.test``.

Counted :class:`~components.data.sources.Skip` records (or :class:`SourceError` under
``bad_input: error``): a null or empty image cell (``missing-image``), a missing label or a
``ClassLabel`` index outside its names (``missing-label``, ``unknown-label``), a data file that
is missing, not an Arrow stream or without the image / label column (``unreadable-shard``, one
per file). Captions (a string / binary column, or a list of them: its first entry) follow
``captions.missing`` like every source's.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, unquote

import numpy as np

from components.data.hf_features import class_label_names, class_label_value, hf_feature
from components.data.shard_items import MISSING_IMAGE, _stamp, image_cell_bytes
from components.data.shard_paths import CodedColumn, ShardPaths
from components.data.shard_sources import (
    UNREADABLE_SHARD,
    ShardOptions,
    _Lister,
    image_type_problem,
)
from components.data.sources import UNKNOWN_LABEL, ItemTable, Listing, SourceError

STATE_JSON = "state.json"
INFO_JSON = "dataset_info.json"
DICT_JSON = "dataset_dict.json"
OFFICIAL = ("train", "test")  # split names kept as Item.official_split (both must be read)
# the published validation split's names: kept as val beside an official train and test
VALIDATION = ("validation", "valid", "val")


@dataclasses.dataclass(frozen=True, kw_only=True)
class HFSplit:
    """One ``save_to_disk`` folder: its split name (``None``: a lone Dataset), its data files
    in ``state.json``'s order and its ``features`` (``None`` when ``dataset_info.json`` has
    none: each file's schema metadata is used)."""

    name: str | None
    folder: str
    files: list[str]
    features: dict[str, Any] | None


def _json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise SourceError(f"{path} cannot be read as JSON ({e}); is it a folder written by "
                          "datasets' save_to_disk?") from None


def _one_split(folder: str, name: str | None) -> HFSplit:
    state_path = os.path.join(folder, STATE_JSON)
    if not os.path.isfile(state_path):
        raise SourceError(f"{folder} has no {STATE_JSON}: not a folder written by datasets' "
                          "Dataset.save_to_disk")
    state = _json(state_path)
    files = state.get("_data_files") if isinstance(state, dict) else None
    if (not isinstance(files, list) or not files
            or not all(isinstance(f, dict) and isinstance(f.get("filename"), str) for f in files)):
        raise SourceError(f"{state_path} lists no data files (_data_files: "
                          "[{\"filename\": ...}, ...])")
    features = None
    info_path = os.path.join(folder, INFO_JSON)
    if os.path.isfile(info_path):
        info = _json(info_path)
        got = info.get("features") if isinstance(info, dict) else None
        features = got if isinstance(got, dict) else None
    return HFSplit(name=name, folder=folder, features=features,
                   files=[os.path.join(folder, f["filename"]) for f in files])


def hf_splits(path: str, split: Sequence[str] | None = None) -> list[HFSplit]:
    """The splits to read under ``path``: a DatasetDict's (``split``: which, in that order;
    default all, in ``dataset_dict.json``'s order) or a lone Dataset.

    Raises:
        SourceError: ``path`` is not a ``save_to_disk`` folder, a split named is not in it, or
            ``split`` is set for a lone Dataset.
    """
    if "://" in path:
        raise SourceError(f"source.path={path!r}: a huggingface source is read from a local "
                          "folder (memory-mapped); copy it here first, or export it to Parquet "
                          "(Dataset.to_parquet) and use source.kind=parquet")
    if not os.path.isdir(path):
        raise SourceError(f"source.path={path!r} is not a folder written by datasets' "
                          "save_to_disk")
    dict_path = os.path.join(path, DICT_JSON)
    if not os.path.isfile(dict_path):
        if split is not None:
            raise SourceError(f"source.split={list(split)!r}: {path} is a single Dataset (no "
                              f"{DICT_JSON}), not a DatasetDict; remove source.split")
        return [_one_split(path, None)]
    listed = _json(dict_path)
    names = listed.get("splits") if isinstance(listed, dict) else None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SourceError(f"{dict_path} has no list of splits ({{\"splits\": [...]}})")
    chosen = list(names) if split is None else list(split)
    unknown = [s for s in chosen if s not in names]
    if unknown:
        raise SourceError(f"source.split={unknown[0]!r} is not a split of {path}: it has "
                          f"{', '.join(names)}")
    return [_one_split(os.path.join(path, s), s) for s in chosen]


def _text_type(t: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_binary(t) or pa.types.is_large_binary(t))


def _caption(value: object) -> bytes | str | None:
    if isinstance(value, list):  # several captions per image (COCO-like): the first
        value = value[0] if value else None
    return value if isinstance(value, bytes | str) else None


def _missing_images(column: Any) -> list[bool]:
    """Which cells of an image column (binary, or a struct with ``bytes``) hold no bytes: read
    from validity bitmaps and offsets only, never the bytes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    missing = column.is_null()
    data = column
    if pa.types.is_struct(column.type):
        data = column.field("bytes")
        missing = pc.or_(missing, data.is_null())
    empty = pc.fill_null(pc.equal(pc.binary_length(data), 0), True)
    return [bool(x) for x in pc.or_(missing, empty).to_pylist()]


class HFLister:
    """One listing's state across splits and files: the rows as columns (``lister``), the
    shared ClassLabel names."""

    def __init__(self, path: str, on_bad_input: str, options: ShardOptions,
                 splits: list[HFSplit], spill: str | None = None) -> None:
        self.lister = _Lister(path, on_bad_input, spill)
        self.lister.label_setting = f"source.label_column={options.label_column!r}"
        self.options = options
        self.splits = splits

    def table(self, classes: Sequence[str] | None) -> ItemTable:
        """The kept items as columns (``classes``: default the ClassLabel's names); when both
        a ``train`` and a ``test`` split are read, each item's split is its data file's
        (:class:`~components.data.shard_paths.CodedColumn`: one int8 an item).

        Raises:
            SourceError: no items; or under ``bad_input: error`` the first problem in listing
                order.
        """
        table = self.lister.table(classes, self.options.label_column is not None)
        if not set(OFFICIAL) <= {s.name for s in self.splits} or not len(table):
            return table
        official = {f: s.name for s in self.splits if s.name in OFFICIAL for f in s.files}
        official |= {f: "val" for s in self.splits if s.name in VALIDATION for f in s.files}
        paths = table.paths
        assert isinstance(paths, ShardPaths)
        # each data file's split from its prefix (``<file>#arrow:``, or a path kept whole)
        values: list[str | None] = [None, *OFFICIAL, "val"]
        code = np.array([values.index(official.get(p.partition("#arrow:")[0]))
                         for p in paths.prefixes], dtype=np.int8)
        codes = code[paths.file] if len(code) else np.zeros(len(table), np.int8)
        if not codes.any():
            return table  # no kept item is in train or test
        return dataclasses.replace(table, official=CodedColumn(values, codes))

    def file(self, split: HFSplit, file: str) -> None:
        """List one data file (counted ``unreadable-shard`` when it cannot be read)."""
        import pyarrow as pa

        opts, lister = self.options, self.lister
        try:
            with pa.memory_map(file, "r") as source:
                reader = pa.ipc.open_stream(source)
                schema = reader.schema
                problem = image_type_problem(schema, opts.image_column)
                if problem is not None:
                    lister.skip(file, UNREADABLE_SHARD, problem)
                    return
                label = opts.label_column
                if label is not None and label not in schema.names:
                    lister.skip(file, UNREADABLE_SHARD, f"has no column {label!r} (it has "
                                f"{schema.names}): set source.label_column")
                    return
                names = class_label_names(hf_feature(schema, label, split.features))
                lister.class_label(names, file, label)
                cap = lister.caption_column(opts.caption_column, schema.names, file)
                if cap is not None and not _text_type(schema.field(cap).type):
                    raise SourceError(
                        f"source.caption_column={cap!r} holds {schema.field(cap).type} in "
                        f"{file}, not text: name a string column, or null (no captions)")
                self._batches(reader, file, cap, names)
        except SourceError:
            raise  # bad_input: error, or a mistaken column
        except (OSError, ValueError, EOFError) as e:  # ArrowInvalid is a ValueError
            lister.skip(file, UNREADABLE_SHARD, f"not a readable Arrow stream file "
                        f"(datasets' save_to_disk writes them): {e}")

    def _batches(self, reader: Any, file: str, cap: str | None, names: list[str] | None) -> None:
        opts, lister = self.options, self.lister
        column = quote(opts.image_column, safe="")
        label = opts.label_column
        for b, batch in enumerate(reader):
            missing = _missing_images(batch.column(opts.image_column))
            labels = batch.column(label).to_pylist() if label else None
            caps = batch.column(cap).to_pylist() if cap else None
            for row in range(batch.num_rows):
                path = f"{file}#arrow:{b}:{row}:{column}"
                if missing[row]:
                    lister.skip(path, MISSING_IMAGE, f"row {row} of record batch {b} has no "
                                f"image bytes (null or empty){_path_hint(batch, opts, row)}")
                    continue
                raw = None if labels is None else labels[row]
                if names is not None:
                    raw, problem = class_label_value(raw, names)
                    if problem is not None:
                        lister.skip(path, UNKNOWN_LABEL, problem)
                        continue
                lister.add(path, None, raw, None if caps is None else _caption(caps[row]), file)


def _path_hint(batch: Any, opts: ShardOptions, row: int) -> str:
    """Where an Image cell without bytes points, if anywhere (an image saved as a path)."""
    import pyarrow as pa

    column = batch.column(opts.image_column)
    if not pa.types.is_struct(column.type) or column.type.get_field_index("path") < 0:
        return ""
    where = column.field("path")[row].as_py()
    return (f"; it names only the file {where!r}, whose bytes were not embedded when the "
            "dataset was saved") if where else ""


def list_huggingface(path: str, *, classes: Sequence[str] | None = None,
                     on_bad_input: str = "skip", options: ShardOptions) -> Listing:
    """A ``save_to_disk`` folder as :class:`~components.data.sources.Item` objects
    (:func:`huggingface_lister`; the build lists it as columns).

    Raises:
        SourceError: as :func:`huggingface_lister` and :meth:`HFLister.table`.
    """
    table = huggingface_lister(path, on_bad_input=on_bad_input, options=options).table(classes)
    return Listing(table.items(), table.classes, table.skipped)


def huggingface_lister(path: str, *, on_bad_input: str = "skip",
                       options: ShardOptions, spill: str | None = None) -> HFLister:
    """A ``save_to_disk`` folder (Dataset or DatasetDict) listed into columns: one item per
    row, split by split (``options.split``), file by file, record batch by record batch; no
    image bytes read, no object per item (:class:`~components.data.shard_sources._Lister`;
    ``spill``: where its captions' text bytes go, as ``webdataset_lister``'s).

    Raises:
        SourceError: not such a folder, an unknown split, a caption column that is not text or
            ClassLabel names that differ between splits (no items, or a bad item under
            ``bad_input: error``: :meth:`HFLister.table`).
    """
    splits = hf_splits(path, options.split)
    hf = HFLister(path, on_bad_input, options, splits, spill)
    with hf.lister.reading():
        for split in splits:
            for file in split.files:
                hf.file(split, file)
    return hf


# ---------------------------------------------------------------------------------------------
# Reading one item (inside the Ray stages).


@functools.lru_cache(maxsize=2)
def _batches(file: str, stamp: tuple[int, int]) -> list[Any]:
    """A data file's record batches, memory-mapped (``stamp``: the cache key's file
    version)."""
    import pyarrow as pa

    return list(pa.ipc.open_stream(pa.memory_map(file, "r")))


def read_arrow_item(file: str, batch: int, row: int, column: str) -> bytes:
    """The image bytes of a ``huggingface`` item (:func:`components.data.sources.shard_item`'s
    parts: data file, record batch, row, %-quoted image column).

    Raises:
        OSError: the file cannot be read, or has changed since it was listed.
        components.data.images.ImageError: the cell holds no bytes (``missing-image``).
    """
    name = unquote(column)
    try:
        batches = _batches(file, _stamp(file))
    except (ValueError, EOFError) as e:  # ArrowInvalid
        raise OSError(f"{file}: not a readable Arrow stream ({e})") from None
    if batch >= len(batches) or row >= batches[batch].num_rows:
        raise OSError(f"{file}: no row {row} in record batch {batch} (changed since it was "
                      "listed)")
    rb = batches[batch]
    if name not in rb.schema.names:
        raise OSError(f"{file}: record batch {batch} has no column {name!r} (changed since it "
                      "was listed)")
    return image_cell_bytes(rb.column(name)[row].as_py(),
                            f"{file}: row {row} of record batch {batch}")

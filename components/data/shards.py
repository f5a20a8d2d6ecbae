"""FFCV ``.beton`` files: write one shard, merge shards into one file per split, checksum.

Why merge: every FFCV ``Loader`` JIT-compiles its pipeline (15–45 s here) and reads exactly
one file, so a reader over K shards would compile K times per process. Shards are the unit of
parallel, resumable writing; the reader reads one merged file per split.

The FFCV 1.0.2 file layout (``ffcv/types.py``, ``ffcv/writer.py``)::

    header | field descriptors | metadata[num_samples] | page-aligned data pages | alloc table

Merging copies each shard's pages to a page-aligned offset (so FFCV's page reads stay
valid), shifts every pointer in the metadata and the allocation table by that offset, and
renumbers the allocation table's sample ids. Same fields and page size are required.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from components.errors import SimgraphError
from components.io.files import atomic_open

# Stored field names, in file order. `caption` exists only when captions are embedded.
IMAGE, LABEL, SAMPLE_ID, CAPTION = "image", "label", "sample_id", "caption"
# A caption field of this dtype holds float16 bit patterns (see write_shard).
F16_BITS = np.dtype(np.int16)
MIN_PAGE_SIZE = 1 << 21
# A dataset dir: its manifest (written last by the build, read by the reader) and format.
# Here, not in reader.py, so the build's Ray tasks need not import torch.
MANIFEST = "manifest.json"
FORMAT = "simgraph-dataset/1"


class ShardError(SimgraphError, ValueError):
    """A shard cannot be written or merged (mismatched fields, bad layout)."""


def page_size_for(max_side: int, caption_bytes: int) -> int:
    """Smallest power-of-two page (≥ 2 MiB) that holds the largest possible sample.

    FFCV's writer loops forever if a sample does not fit in a page, so this is not optional.
    """
    need = max_side * max_side * 3 + caption_bytes + 4096
    return max(MIN_PAGE_SIZE, 1 << math.ceil(math.log2(need)))


class _Rows:
    """FFCV indexed dataset over decoded rows already in memory (cannot fail mid-write)."""

    def __init__(
        self,
        images: Sequence[np.ndarray],
        labels: np.ndarray,
        ids: np.ndarray,
        *,
        captions: np.ndarray | None,
    ) -> None:
        self.images, self.labels, self.ids, self.captions = images, labels, ids, captions

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple:
        row = (self.images[i], int(self.labels[i]), int(self.ids[i]))
        return row if self.captions is None else (*row, self.captions[i])


def write_shard(
    path: str | Path,
    images: Sequence[np.ndarray],
    labels: np.ndarray,
    sample_ids: np.ndarray,
    captions: np.ndarray | None,
    *,
    write_mode: str,
    jpeg_quality: int,
    page_size: int,
) -> None:
    """Write rows (already decoded RGB ``[H, W, 3]`` uint8) to ``path`` with one writer
    process, so the bytes depend only on the rows (a re-run gives an identical file).

    ``captions``: ``[N, E]`` float16/float32 or ``None``. float16 is stored as its int16 bit
    pattern (:data:`F16_BITS`): numba, which compiles FFCV's pipeline, has no float16, and an
    ``NDArrayField`` of float16 stalled the compiled Loader here. Readers view it back.
    """
    import functools

    import ffcv.writer
    from ffcv.fields import IntField, NDArrayField, RGBImageField
    from tqdm import tqdm

    # FFCV's writer always shows a bar; one per shard task would interleave with Ray Data's.
    ffcv.writer.tqdm = functools.partial(tqdm, disable=True)  # type: ignore[attr-defined]
    fields: dict = {
        IMAGE: RGBImageField(write_mode=write_mode, jpeg_quality=jpeg_quality),
        LABEL: IntField(),
        SAMPLE_ID: IntField(),
    }
    if captions is not None:
        if captions.dtype == np.float16:
            captions = captions.view(F16_BITS)
        elif captions.dtype != np.float32:
            raise ShardError(f"captions dtype {captions.dtype} is not float16 or float32")
        fields[CAPTION] = NDArrayField(dtype=captions.dtype, shape=(captions.shape[1],))
    writer = ffcv.writer.DatasetWriter(str(path), fields, page_size=page_size, num_workers=1)
    writer.from_indexed_dataset(_Rows(images, labels, sample_ids, captions=captions), chunksize=256)


def _pointer_columns(handlers: Sequence[object]) -> list[tuple[str, str | None]]:
    """(metadata column, sub-field or None) for every pointer into the data region."""
    from ffcv.fields import BytesField, FloatField, IntField, JSONField, NDArrayField, RGBImageField

    out: list[tuple[str, str | None]] = []
    for i, h in enumerate(handlers):
        col = f"f{i}"
        if isinstance(h, RGBImageField):
            out.append((col, "data_ptr"))
        elif isinstance(h, NDArrayField):
            out.append((col, None))
        elif isinstance(h, BytesField | JSONField):
            out.append((col, "ptr"))
        elif not isinstance(h, IntField | FloatField):
            raise ShardError(f"cannot merge a field of type {type(h).__name__}")
    return out


def merge_shards(parts: Sequence[str | Path], out: str | Path) -> int:
    """Concatenate FFCV files into ``out``, written whole or not at all (atomic_open).

    Returns the number of samples. Sample order is the parts' order, then each part's order.

    Raises:
        ShardError: the parts differ in fields or page size, or none is given.
    """
    from ffcv.reader import Reader
    from ffcv.types import ALLOC_TABLE_TYPE, HeaderType
    from ffcv.utils import align_to_page

    if not parts:
        raise ShardError("nothing to merge")
    readers = [Reader(str(p)) for p in parts]
    first = readers[0]
    for p, r in zip(parts, readers, strict=True):
        if r.page_size != first.page_size or r.field_descriptors.tobytes() != (
            first.field_descriptors.tobytes()
        ):
            raise ShardError(f"{p} has other fields or page size than {parts[0]}")
    page = int(first.page_size)
    ptr_cols = _pointer_columns(list(first.handlers.values()))
    total = sum(int(r.num_samples) for r in readers)
    meta_start = HeaderType.itemsize + first.field_descriptors.nbytes
    data_start = align_to_page(meta_start + total * first.metadata_type.itemsize, page)

    metas, allocs = [], []
    with atomic_open(out, "wb") as f:
        f.truncate(data_start)
        f.seek(data_start)
        offset, cursor = 0, data_start
        for p, r in zip(parts, readers, strict=True):
            meta = r.metadata.copy()
            alloc = r.alloc_table.copy()
            src_start = align_to_page(meta_start + int(r.num_samples) * r.metadata_type.itemsize,
                                      page)
            src_end = int(r.header["alloc_table_ptr"])
            for col, sub in ptr_cols:
                view = meta[col] if sub is None else meta[col][sub]  # a view into meta
                view[...] = (view.astype(np.int64) + (cursor - src_start)).astype(np.uint64)
            alloc["ptr"] = (alloc["ptr"].astype(np.int64) + (cursor - src_start)).astype(np.uint64)
            alloc["sample_id"] += np.uint64(offset)
            with open(p, "rb") as src:
                src.seek(src_start)
                remaining = max(0, src_end - src_start)
                while remaining:
                    block = src.read(min(remaining, 1 << 24))
                    if not block:
                        raise ShardError(f"{p} is truncated")
                    f.write(block)
                    remaining -= len(block)
            cursor = align_to_page(cursor + max(0, src_end - src_start), page)
            f.seek(cursor)
            metas.append(meta)
            allocs.append(alloc)
            offset += int(r.num_samples)
        f.truncate(cursor)
        f.seek(cursor)
        alloc_table = np.concatenate(allocs).astype(ALLOC_TABLE_TYPE) if allocs else None
        if alloc_table is not None:
            f.write(alloc_table.tobytes())
        header = first.header.copy()
        header["num_samples"] = total
        header["alloc_table_ptr"] = cursor
        f.seek(0)
        f.write(header.tobytes())
        f.write(first.field_descriptors.tobytes())
        # Field by field into zeros: copying structured arrays whole leaves their padding
        # bytes undefined, and the file would not be byte-identical across runs.
        merged = np.zeros(total, dtype=first.metadata_type)
        start = 0
        for meta in metas:
            for name in merged.dtype.names or ():
                merged[name][start : start + len(meta)] = meta[name]
            start += len(meta)
        f.write(merged.tobytes())
    return total


def read_int_field(path: str | Path, name: str) -> np.ndarray:
    """One ``IntField`` column (``label``, ``sample_id``) of every sample, from the metadata
    alone: no image is read (fast on any size)."""
    from ffcv.reader import Reader

    r = Reader(str(path))
    names = list(r.handlers)
    if name not in names:
        raise ShardError(f"{path} has no field {name!r} (it has {names})")
    return np.asarray(r.metadata[f"f{names.index(name)}"], dtype=np.int64)


def read_samples(path: str | Path, indices: Sequence[int] | None = None) -> list[dict]:
    """Read samples straight from a ``.beton`` file, without a Loader (no JIT, any image size).

    For checks and tools, not for training. Returns dicts with ``image`` (``[H, W, 3]`` uint8),
    ``label``, ``sample_id`` and ``caption`` (if stored).
    """
    import io

    from ffcv.reader import Reader
    from PIL import Image

    r = Reader(str(path))
    names = list(r.handlers)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    out = []
    for i in range(int(r.num_samples)) if indices is None else indices:
        row = r.metadata[i]
        sample: dict = {}
        for j, name in enumerate(names):
            m, handler = row[f"f{j}"], r.handlers[name]
            if name == IMAGE:
                w, h, ptr = int(m["width"]), int(m["height"]), int(m["data_ptr"])
                size = _alloc_size(r, i, ptr)
                raw = bytes(data[ptr : ptr + size])
                if int(m["mode"]) == 0:  # jpg
                    sample[name] = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))
                else:
                    sample[name] = np.frombuffer(raw, np.uint8)[: h * w * 3].reshape(h, w, 3)
            elif name == CAPTION:
                dt, shape = handler.dtype, handler.shape  # type: ignore[attr-defined]
                n = int(np.prod(shape)) * dt.itemsize
                arr = np.frombuffer(bytes(data[int(m) : int(m) + n]), dt).reshape(shape)
                sample[name] = arr.view(np.float16) if dt == F16_BITS else arr
            else:
                sample[name] = int(m)
        out.append(sample)
    return out


def rows_of(path: str | Path, sample_ids: Sequence[int]) -> list[int]:
    """File rows (``read_samples`` indices) holding these dataset-wide sample ids, in order.

    Raises:
        ShardError: an id that is not in the file.
    """
    where = {int(sid): row for row, sid in enumerate(read_int_field(path, SAMPLE_ID))}
    missing = [i for i in sample_ids if int(i) not in where]
    if missing:
        raise ShardError(f"{path} holds no sample id {missing[0]} ({len(missing)} missing)")
    return [where[int(i)] for i in sample_ids]


def _alloc_size(r: object, sample: int, ptr: int) -> int:
    table = r.alloc_table  # type: ignore[attr-defined]
    hit = table[(table["sample_id"] == sample) & (table["ptr"] == ptr)]
    if len(hit) != 1:
        raise ShardError(f"sample {sample}: no allocation at {ptr}")
    return int(hit["size"][0])

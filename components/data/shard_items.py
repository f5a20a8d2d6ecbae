"""Reading one item of a ``webdataset`` / ``parquet`` / ``huggingface`` source inside the Ray
stages (hashing, shard writing): its image bytes from the offsets or the row group and row the
listing recorded (:mod:`components.data.shard_sources`), and an image cell's bytes.
"""

from __future__ import annotations

import functools
import os
from typing import Any
from urllib.parse import unquote

from components.data.shard_files import open_shard

MISSING_IMAGE = "missing-image"  # the skip reason (components.data.shard_sources' too)


def _stamp(file: str) -> tuple[int, int]:
    """(size, mtime_ns) of a shard: a cached row group is re-read after the file changes."""
    if "://" not in file:
        st = os.stat(file)
        return st.st_size, st.st_mtime_ns
    import pyarrow.fs as pafs

    fs, inner = pafs.FileSystem.from_uri(file)
    info = fs.get_file_info(inner)
    return int(info.size or 0), int(info.mtime_ns or 0)


@functools.lru_cache(maxsize=2)
def _row_group(file: str, rg: int, column: str, stamp: tuple[int, int]) -> Any:
    """The image column of one row group (a pyarrow array; ``stamp``: the cache key's file
    version)."""
    import pyarrow.parquet as pq

    with open_shard(file) as f:
        return pq.ParquetFile(f).read_row_group(rg, columns=[column]).column(0).combine_chunks()


def read_shard_item(file: str, kind: str, a: int, b: int, column: str) -> bytes:
    """The image bytes of a shard item (:func:`components.data.sources.shard_item`'s parts).

    Raises:
        OSError: the shard cannot be read, or holds fewer bytes than listed (truncated or
            changed since).
        components.data.images.ImageError: the Parquet cell is null (``missing-image``).
    """
    if kind == "tar":
        with open_shard(file) as f:
            f.seek(a)
            data = f.read(b)
        if len(data) != b:
            raise OSError(f"{file}: {b} bytes listed at offset {a}, {len(data)} read (the shard "
                          "is truncated or changed since it was listed)")
        return bytes(data)
    name = unquote(column)
    try:
        arr = _row_group(file, a, name, _stamp(file))
    except (KeyError, IndexError, ValueError) as e:
        raise OSError(f"{file}: row group {a} column {name!r} cannot be read ({e})") from None
    if b >= len(arr):
        raise OSError(f"{file}: row group {a} has {len(arr)} rows, not {b + 1} (changed since "
                      "it was listed)")
    return image_cell_bytes(arr[b].as_py(), f"{file}: row {b} of row group {a}")


def image_cell_bytes(value: object, where: str) -> bytes:
    """The image bytes of one cell of an image column (binary, or a struct with ``bytes`` as
    Hugging Face writes) as Python gives it; ``where`` names the cell in the error.

    Raises:
        components.data.images.ImageError: the cell holds no bytes (``missing-image``).
    """
    if isinstance(value, dict):
        value = value.get("bytes")
    if not isinstance(value, bytes | bytearray | memoryview) or not value:
        from components.data.images import ImageError

        raise ImageError(MISSING_IMAGE, f"{where} has no image bytes")
    return bytes(value)

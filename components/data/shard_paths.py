"""The paths of a shard source's items as columns (:class:`ShardPaths`): what the build
holds per item instead of a path str (:class:`components.data.sources.ItemTable`); a column
of a few distinct values as codes (:class:`CodedColumn`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np


class ShardPaths(Sequence[str]):
    """The paths of shard items (:data:`SHARD_ITEM`) as columns: a table of per-file prefixes
    (``<shard>#tar:``) and tails (``""``, or ``:<column>`` for Parquet), and per item a file
    index (int32) and the two numbers (int64: tar data offset and size; row group and row) —
    20 B an item instead of a ~130-B str repeating the shard's path. ``paths[i]`` builds one
    str on demand; an item whose ``a`` is -1 is the prefix alone (a path the columns cannot
    split, kept whole)."""

    def __init__(self, prefixes: list[str], tails: list[str], file: np.ndarray,
                 a: np.ndarray, b: np.ndarray) -> None:
        self.prefixes, self.tails = prefixes, tails
        self.file = np.asarray(file, dtype=np.int32)  # [n] index into prefixes / tails
        self.a = np.asarray(a, dtype=np.int64)  # [n]
        self.b = np.asarray(b, dtype=np.int64)  # [n]

    def __len__(self) -> int:
        return len(self.file)

    def _path(self, i: int) -> str:
        f, a = int(self.file[i]), int(self.a[i])
        if a < 0:
            return self.prefixes[f]
        return f"{self.prefixes[f]}{a}:{int(self.b[i])}{self.tails[f]}"

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._path(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._path(i)

    def __iter__(self) -> Iterator[str]:
        prefixes, tails = self.prefixes, self.tails
        for start in range(0, len(self.file), 1 << 14):  # Python ints for a chunk at a time
            chunk = slice(start, start + (1 << 14))
            for f, a, b in zip(self.file[chunk].tolist(), self.a[chunk].tolist(),
                               self.b[chunk].tolist(), strict=True):
                yield prefixes[f] if a < 0 else f"{prefixes[f]}{a}:{b}{tails[f]}"

    def take(self, idx: np.ndarray) -> ShardPaths:
        return ShardPaths(self.prefixes, self.tails, self.file[idx], self.a[idx], self.b[idx])

    def compact(self, idx: np.ndarray) -> ShardPaths:
        """:meth:`take`, with a prefix table of only the files those items are in: what a
        Ray task is handed (a few shards' prefixes, not every shard's)."""
        used, file = np.unique(self.file[idx], return_inverse=True)
        return ShardPaths([self.prefixes[f] for f in used.tolist()],
                          [self.tails[f] for f in used.tolist()], file.reshape(-1),
                          self.a[idx], self.b[idx])


class CodedColumn(Sequence[str | None]):
    """A per-item column of a few distinct values (a Hugging Face item's official split:
    ``"train"``, ``"test"`` or ``None``) as one int8 code an item into ``values``."""

    def __init__(self, values: list[str | None], codes: np.ndarray) -> None:
        self.values = values
        self.codes = np.asarray(codes, dtype=np.int8)  # [n] index into values

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self.values[c] for c in self.codes[i].tolist()]
        return self.values[int(self.codes[i])]

    def __iter__(self) -> Iterator[str | None]:
        values = self.values
        for start in range(0, len(self.codes), 1 << 14):
            yield from (values[c] for c in self.codes[start:start + (1 << 14)].tolist())

    def take(self, idx: np.ndarray) -> CodedColumn:
        return CodedColumn(self.values, self.codes[idx])


def take_column(column: Sequence[str | None], idx: np.ndarray) -> Sequence[str | None]:
    """``[column[i] for i in idx]``, still coded for a :class:`CodedColumn`."""
    if isinstance(column, CodedColumn):
        return column.take(idx)
    return [column[i] for i in idx.tolist()]


def take_paths(paths: Sequence[str], idx: np.ndarray, compact: bool = False) -> Sequence[str]:
    """``[paths[i] for i in idx]``, still columns for :class:`ShardPaths` (``compact``: with
    only the prefixes they use, :meth:`ShardPaths.compact`: a Ray task's argument)."""
    if isinstance(paths, ShardPaths):
        return paths.compact(idx) if compact else paths.take(idx)
    return [paths[i] for i in idx.tolist()]

"""Append-only byte buffers the driver reads back but need not hold: :class:`SpillBuffer`.

A build's caption texts (CC12M: ~12M captions, ~1.3 GB of UTF-8) are read once while the
source is listed and then read again, a block at a time, to sort and embed them. Held in the
driver's heap they are its largest per-item cost; written to a file in the build's dir and
mapped, the pages read are the kernel's clean page cache, which it drops under pressure and
this process never has to give back. The file is unlinked from the start
(``tempfile.TemporaryFile``: ``O_TMPFILE`` where the filesystem has it): nothing for a killed
build to leave behind, nothing a resumed one could mistake for its own.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from typing import IO, Any

import numpy as np

CHUNK = 1 << 22  # bytes gathered before one write (4 MiB)


class SpillBuffer:
    """Bytes appended in order, then read as one ``uint8`` array (:meth:`array`).

    ``directory`` None: held in memory (a ``bytearray``; tests, small tools). Else appended
    to an unlinked file there, written ``CHUNK`` bytes at a time, and :meth:`array` maps it
    read-only (the file lives as long as the array or a view of it).

    Raises:
        OSError: ``directory`` cannot take a file (missing, read-only, full), naming it.
    """

    __slots__ = ("_done", "_file", "_memory", "_size", "directory")

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = None if directory is None else os.fspath(directory)
        self._memory = bytearray()  # in memory: everything; spilled: the bytes not yet written
        self._file: IO[bytes] | None = None
        self._size = 0
        self._done = False
        if self.directory is not None:
            try:
                self._file = tempfile.TemporaryFile(dir=self.directory)
            except OSError as e:
                raise OSError(f"cannot write a scratch file in {self.directory}: {e}") from e

    def __len__(self) -> int:
        return self._size

    def append(self, data: bytes | np.ndarray) -> None:
        """Append ``data``'s bytes (``bytes``, or a contiguous array's)."""
        if self._done:
            raise RuntimeError("SpillBuffer.append() after array(): its bytes were handed on")
        view = data if isinstance(data, bytes) else data.view(np.uint8).reshape(-1).data
        self._memory += view
        self._size += len(view)
        if self._file is not None and len(self._memory) >= CHUNK:
            self._flush()

    def _flush(self) -> None:
        assert self._file is not None
        self._file.write(self._memory)
        self._memory = bytearray()

    def array(self) -> np.ndarray:
        """``[len(self)]`` uint8: every byte appended (a read-only map of the file when
        spilled). The buffer is handed on: appending after this is an error."""
        if self._done:
            raise RuntimeError("SpillBuffer.array() hands its bytes on once")
        self._done = True
        if self._file is None:
            memory, self._memory = self._memory, bytearray()
            return np.frombuffer(memory, np.uint8) if memory else np.zeros(0, np.uint8)
        self._flush()
        f, self._file = self._file, None
        with f:
            f.flush()
            if not self._size:
                return np.zeros(0, np.uint8)
            # the map keeps the unlinked file alive after ours is closed
            return np.memmap(f, dtype=np.uint8, mode="r", shape=(self._size,))


def mapping_of(a: Any) -> mmap.mmap | None:
    """The file mapping ``a``'s memory belongs to (a ``np.memmap`` or a view of one), or
    None."""
    while a is not None and not isinstance(a, mmap.mmap):
        a = getattr(a, "_mmap", None) or getattr(a, "base", None)
    return a


def release(a: Any) -> None:
    """Let go of the pages of ``a``'s file mapping that this process has read
    (``MADV_DONTNEED``: they stay in the page cache, clean, not in this process's RSS); nothing
    for an array in memory. After reading a spilled or mapped array piece by piece, its RSS
    stays at a piece's, not the file's."""
    mapped = mapping_of(a)
    if mapped is not None:
        mapped.madvise(mmap.MADV_DONTNEED)


def spill_copy(parts: list[np.ndarray], directory: str | None) -> np.ndarray:
    """The ``uint8`` arrays ``parts`` (each a mapped file's or in memory) concatenated into a
    :class:`SpillBuffer` in ``directory``, ``CHUNK`` bytes at a time (no copy of the whole in
    memory when ``directory`` is given)."""
    out = SpillBuffer(directory)
    for p in parts:
        for s in range(0, len(p), CHUNK):
            out.append(np.ascontiguousarray(p[s:s + CHUNK]))
    return out.array()

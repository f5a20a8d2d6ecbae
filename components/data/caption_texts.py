"""A build's caption table held compactly: :class:`CaptionTexts`, the unique texts as one UTF-8
buffer and offsets (an Arrow ``large_string`` array's layout), not a Python str per caption.

With web captions nearly every item has its own (CC12M: ~12M), and a str is ~50 B of header
on top of its text, plus a list slot: ~110 B a caption, held from the listing to the end of
the build, and a second table of references for the plan's sorted order. Here a caption is its
UTF-8 bytes and 8 B of offset; the plan's sorted table is an index into the listing's
(:meth:`CaptionTexts.sorted_subset`: 8 B a caption), sorted by Arrow (UTF-8 byte order is
code-point order: the order ``sorted()`` gives the strs). Reading one gives a str; every
consumer that indexes, slices or iterates a ``Sequence[str]`` reads it unchanged.
"""

from __future__ import annotations

import hashlib
import itertools
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from components.io.spill import SpillBuffer, release, spill_copy


class CaptionTexts(Sequence[str]):
    """``n`` texts: ``data[offsets[k]:offsets[k + 1]]`` is base text ``k`` (UTF-8), and item
    ``i`` is base text ``rows[i]`` (``rows`` None: item ``i`` is base text ``i``).

    Equal to any sequence of the same strs, in order (as a list would be). ``spill``: the
    directory a new table made from this one keeps its text bytes in (a mapped, unlinked
    file: :class:`~components.io.spill.SpillBuffer`); None: in memory."""

    __slots__ = ("data", "offsets", "rows", "spill")

    def __init__(self, data: np.ndarray, offsets: np.ndarray,
                 rows: np.ndarray | None = None, spill: str | None = None) -> None:
        self.data = data  # [bytes] uint8 (a read-only map of a spill file, or in memory)
        self.offsets = offsets  # [base + 1] int64
        self.rows = rows  # [n] int64, or None
        self.spill = spill

    @classmethod
    def of(cls, texts: Iterable[str]) -> CaptionTexts:
        """The texts, in order (built without holding them: one buffer grown as they come)."""
        data, ends = bytearray(), array("q", [0])
        for t in texts:
            data += t.encode("utf-8", "surrogatepass")
            ends.append(len(data))
        return cls(np.frombuffer(bytes(data), np.uint8) if data else np.zeros(0, np.uint8),
                   np.frombuffer(ends, np.int64).copy())

    def __len__(self) -> int:
        return len(self.offsets) - 1 if self.rows is None else len(self.rows)

    def _base(self, k: int) -> str:
        a, b = int(self.offsets[k]), int(self.offsets[k + 1])
        return self.data[a:b].tobytes().decode("utf-8", "surrogatepass")

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            a, b, step = i.indices(len(self))
            if step != 1:
                return [self[k] for k in range(a, b, step)]
            return self._chunk(a, b)
        n = len(self)
        k = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= k < n:
            raise IndexError(f"caption {i} of {n}")
        return self._base(k if self.rows is None else int(self.rows[k]))

    def _chunk(self, a: int, b: int) -> list[str]:
        """Items ``a:b`` as strs, converted by Arrow (not one decode call per text)."""
        if b <= a:
            return []
        base = self.arrow()
        part = (base.slice(a, b - a) if self.rows is None
                else base.take(self.rows[a:b]))
        try:
            return list(part.to_pylist())
        except UnicodeDecodeError:  # a lone surrogate (a JSON caption's "\ud800"): one by one
            return [self[k] for k in range(a, b)]
        finally:
            self.release()

    def release(self) -> None:
        """Let go of the spilled text pages read so far (:func:`~components.io.spill.release`):
        a table read a chunk at a time (sorted, counted, written, embedded) keeps a chunk's
        pages in this process's RSS, not the file's (CC12M: ~1.3 GB)."""
        release(self.data)

    def __iter__(self) -> Iterator[str]:
        step = 1 << 16  # texts converted at a time
        for a in range(0, len(self), step):
            yield from self._chunk(a, min(a + step, len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other,
                                                                         strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable-looking, compared by value

    def __repr__(self) -> str:
        head = ", ".join(repr(t) for t in self[:3])
        return f"CaptionTexts([{head}{', ...' if len(self) > 3 else ''}], n={len(self)})"

    def arrow(self) -> Any:
        """The base texts as an Arrow ``large_string`` array (no copy of the text bytes)."""
        import pyarrow as pa

        base = len(self.offsets) - 1
        return pa.LargeStringArray.from_buffers(
            base, pa.py_buffer(self.offsets), pa.py_buffer(self.data))

    def sorted_subset(self, items: np.ndarray) -> CaptionTexts:
        """Items ``items`` (distinct item numbers, of a base table: no rows of its own) sorted as
        ``sorted()`` sorts their strs — an index into this table, its text bytes shared."""
        import pyarrow.compute as pc

        if self.rows is not None:
            raise ValueError("sorted_subset takes a base table (no rows of its own)")
        items = np.asarray(items, dtype=np.int64)
        pool = _pool()
        every = len(items) == len(self) and (not len(items) or (
            items[0] == 0 and items[-1] == len(items) - 1 and bool(np.all(np.diff(items) > 0))))
        # every text used (web captions): sorted in place, not a taken copy of them all
        subset = self.arrow() if every else pc.take(self.arrow(), items, memory_pool=pool)
        order = np.asarray(pc.sort_indices(subset, memory_pool=pool), dtype=np.int64)
        del subset
        self.release()
        return CaptionTexts(self.data, self.offsets, items[order], spill=self.spill)

    def plus(self, extra: Sequence[str]) -> CaptionTexts:
        """These texts and then ``extra`` (a new base table: ``extra`` is a few class
        templates)."""
        if not extra:
            return self
        more = CaptionTexts.of(extra)
        base = self if self.rows is None else CaptionTexts.of(self)
        # the base bytes copied a chunk at a time into a new spill file (not into memory)
        return CaptionTexts(spill_copy([base.data, more.data], self.spill),
                            np.concatenate([base.offsets, base.offsets[-1] + more.offsets[1:]]),
                            spill=self.spill)


class CaptionReader:
    """A listing's captions as they are read, one raw value (bytes, str or None) an item:
    each is decoded (``decode``: raw -> ``(text, issue)``) when it is not among the last
    :attr:`RECENT` distinct raw values (a dict of those, emptied when full), and its text
    appended to one UTF-8 buffer with a 16-byte blake2b digest. A source of web captions,
    nearly one per item, so never holds a dict of them all (~200 B a caption: a bytes object,
    an int and a slot each) — only 8 B of offset and 16 of digest, its texts' bytes going to a
    file in ``spill`` (a :class:`~components.io.spill.SpillBuffer`; None: held); a source
    with few captions decodes each once. :meth:`finish` deduplicates the texts
    (:func:`unique_texts`: two raw values may decode to one text, and a caption seen again
    after the dict was emptied is an entry again)."""

    RECENT = 1 << 16

    def __init__(self, decode: Callable[[Any], tuple[str | None, str | None]],
                 issues: Sequence[str | None], spill: str | None = None) -> None:
        self._decode, self._issues = decode, list(issues)
        self._recent: dict[Any, int] | None = {}  # raw value -> its entry (None: finished)
        self._data, self._ends, self._digests = SpillBuffer(spill), array("q", [0]), bytearray()
        self._text = array("i")  # per entry: its text's place in the buffer, -1: none
        self._issue = array("b")  # per entry: its index into ``issues``

    def add(self, raw: Any) -> int:
        """The entry of ``raw``: the recent one equal to it, or a new one."""
        recent = self._recent
        if recent is None:
            raise RuntimeError("CaptionReader.add() after finish()")
        entry = recent.get(raw)
        if entry is not None:
            return entry
        if len(recent) >= self.RECENT:
            recent.clear()
        entry = recent[raw] = len(self._text)
        text, issue = self._decode(raw)
        if text is None:
            self._text.append(-1)
        else:
            self._text.append(len(self._ends) - 1)
            utf8 = text.encode("utf-8", "surrogatepass")
            self._data.append(utf8)
            self._ends.append(len(self._data))
            self._digests += hashlib.blake2b(utf8, digest_size=16).digest()
        self._issue.append(self._issues.index(issue))
        return entry

    def finish(self) -> tuple[CaptionTexts, np.ndarray, np.ndarray]:
        """``(texts, text_of, issue_of)``: the distinct texts in order of first appearance,
        each entry's row in them (int32, -1: no text) and its issue's index (int8). Once: the
        buffers are handed on."""
        if self._recent is None:
            raise RuntimeError("CaptionReader.finish() hands its texts on once: call it once")
        self._recent = None
        decoded = CaptionTexts(self._data.array(), np.frombuffer(self._ends, np.int64),
                               spill=self._data.directory)
        texts, of_decoded = unique_texts(decoded, self._digests)
        del decoded
        self._ends, self._digests = array("q"), bytearray()
        at = np.frombuffer(self._text, np.int32)
        text_of = (np.where(at >= 0, of_decoded[np.maximum(at, 0)], -1).astype(np.int32)
                   if len(of_decoded) else np.full(len(at), -1, np.int32))
        return texts, text_of, np.frombuffer(self._issue, np.int8).copy()


def _pool() -> Any:
    """Arrow's allocator for the table's work: the system's, whose large blocks go back to the
    OS when freed (Arrow's default mimalloc keeps them: the driver's RSS kept every transient
    of the deduplication and the sort)."""
    import pyarrow as pa

    return pa.system_memory_pool()


def unique_texts(texts: CaptionTexts, digests: Any = None) -> tuple[CaptionTexts, np.ndarray]:
    """``(unique, ids)``: the distinct texts of a base table in order of first appearance and
    each item's row in them (int32), as a dict of the texts would give — deduplicated on a
    16-byte blake2b of each text's UTF-8 bytes (``digests``: those, concatenated in order, when
    the caller made them while building the table; else made here) by
    :func:`~components.data.integrity.exact_duplicates`' sort. When every text is distinct (web
    captions) the table itself is the unique one, not a copy; else the unique texts' bytes
    are gathered by Arrow a chunk of texts at a time into ``texts.spill`` (none: memory).
    """
    import pyarrow.compute as pc

    from components.data.integrity import duplicate_rows

    if texts.rows is not None:
        raise ValueError("unique_texts takes a base table (no rows of its own)")
    n = len(texts)
    if digests is None:
        digests = b"".join(hashlib.blake2b(texts.data[a:b].tobytes(), digest_size=16).digest()
                           for a, b in itertools.pairwise(texts.offsets.tolist()))
    dropped, kept = duplicate_rows(np.frombuffer(digests, "S16"))  # later copies, their first
    if not len(dropped):
        return texts, np.arange(n, dtype=np.int32)
    rep = np.arange(n)  # each item's first item of its text
    rep[dropped] = kept
    first = rep == np.arange(n)
    ids = (np.cumsum(first) - 1)[rep].astype(np.int32)
    firsts = np.flatnonzero(first)
    del rep, first
    out, base, pool = SpillBuffer(texts.spill), texts.arrow(), _pool()
    for s in range(0, len(firsts), _GATHER):
        part = pc.take(base, firsts[s:s + _GATHER], memory_pool=pool)  # a large_string array
        ends = np.frombuffer(part.buffers()[1], np.int64)[part.offset:part.offset + len(part) + 1]
        out.append(np.frombuffer(part.buffers()[2], np.uint8)[ends[0]:ends[-1]])
        texts.release()
    lengths = np.diff(texts.offsets)[firsts]
    return CaptionTexts(out.array(), np.r_[0, np.cumsum(lengths)].astype(np.int64),
                        spill=texts.spill), ids


_GATHER = 1 << 16  # texts gathered at a time when the unique ones are copied out

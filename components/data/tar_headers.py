"""A tar shard's members read from their 512-byte headers, for listing a ``webdataset`` source
(:func:`components.data.shard_sources.webdataset_lister`): the same members Python's
``tarfile`` lists, at a fraction of its cost (``tarfile`` builds a ``TarInfo`` and parses
every numeric field through Python string functions: ~76 µs an item of three members here;
docs/benchmarks.md).

:func:`tar_members` walks the headers of one shard (plain ustar, GNU and v7 headers of regular
files, directories, links and devices) and returns its regular-file members, with the bytes of
those whose extension the listing reads (captions, labels), or ``None`` when anything in the
shard is outside what it reproduces exactly: a pax or GNU long-name header, a sparse or unknown
member type, a base-256 number, a field or checksum ``tarfile`` would reject, a member whose
data runs past the end of the file, a header cut short. The caller then lists that shard with
``tarfile`` as before, so a truncated or corrupt shard gives the very items and the one-line
``unreadable-shard`` message it gave (``tarfile``'s own words).

What ``tarfile`` lists, and so what is returned (Python 3.11's ``TarFile.next`` and
``TarInfo.frombuf`` / ``_proc_builtin``): the name is the NUL-ended ``name`` field decoded with
``tarfile.ENCODING`` / ``surrogateescape``, behind the ``prefix`` field and a ``/`` when that is
set; a regular member's data follows its header and the next header is at the next multiple of
512; other built-in types have no data; the archive ends at an all-zero block or where the file
ends on a header boundary.
"""

from __future__ import annotations

import tarfile
from typing import IO, NamedTuple

import numpy as np

BLOCK = 512
CHUNK = 1 << 16  # bytes read at a time: a header and the small members after it
_ZERO = bytes(BLOCK)
_REGULAR = frozenset(b"07\0")  # REGTYPE, CONTTYPE, AREGTYPE (typeflag byte values)
_NO_DATA = frozenset(b"123456")  # links, devices, directories, FIFOs: tarfile skips no data


class TarMember(NamedTuple):
    """A regular-file member: its name, where its data starts, its size, and its bytes when
    the listing asked for its extension (``None`` otherwise)."""

    name: str
    offset_data: int
    size: int
    data: bytes | None


def _octal(field: bytes) -> int | None:
    """A numeric header field as ``tarfile``'s ``nti`` reads it, or ``None`` where this reader
    leaves it to ``tarfile`` (base-256, or text ``int`` refuses: ``nti`` refuses it too, or
    reads whitespace that ``bytes.strip`` keeps)."""
    if field[0] in (0o200, 0o377):
        return None
    end = field.find(0)
    text = (field if end < 0 else field[:end]).strip()
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        return None


def _name(field: bytes) -> str:
    end = field.find(0)
    return (field if end < 0 else field[:end]).decode(tarfile.ENCODING, "surrogateescape")


class CutShort(EOFError):
    """A tar file that ends on a header boundary without tar's end-of-archive blocks: cut
    short (a copy or a writer stopped there; with 4 KiB-aligned copies, the likely place).
    ``members``: those before the cut, whole."""

    def __init__(self, size: int, members: list[TarMember]) -> None:
        super().__init__(f"ends at byte {size:,} without tar's end-of-archive blocks: cut "
                         "short (copy it again)")
        self.members = members


def tar_members(f: IO[bytes], wanted: frozenset[str]) -> list[TarMember] | None:
    """The regular-file members of the uncompressed tar ``f`` (seekable, at any position), in
    order, each with its bytes when its extension (WebDataset's: after the base name's first
    dot, lower case) is in ``wanted``; ``None``: list this shard with ``tarfile`` instead.

    Raises:
        OSError: ``f`` cannot be read.
        CutShort: the file ends on a header boundary without the end-of-archive blocks
            (``tarfile`` reads such a file as complete).
    """
    size = f.seek(0, 2)
    members: list[TarMember] = []
    headers = bytearray()  # every header read, for one vectorised checksum at the end
    sums: list[int] = []  # their checksum fields
    checked: set[bytes] = set()  # mode, uid, gid, mtime, devmajor, devminor seen valid
    buf, start = b"", 0  # buf holds the file's bytes [start, start + len(buf))
    pos = 0
    cut = -1  # where the file ends without an end-of-archive block (-1: it has one)
    while True:
        if pos + BLOCK > start + len(buf):
            f.seek(pos)
            buf, start = f.read(CHUNK), pos
        at = pos - start
        h = buf[at:at + BLOCK]
        if len(h) < BLOCK:
            if not h and pos > 0:  # on a header boundary, no end-of-archive block
                cut = size
                break
            return None  # an empty file, or a header cut short
        if h == _ZERO:
            break  # the end-of-archive block
        kind = h[156]
        fixed = h[100:124] + h[136:148] + h[329:345]
        if fixed not in checked:
            if any(_octal(fixed[a:b]) is None
                   for a, b in ((0, 8), (8, 16), (16, 24), (24, 36), (36, 44), (44, 52))):
                return None
            checked.add(fixed)
        try:  # int() skips the ASCII whitespace nti strips; anything else: _octal decides
            n = int(h[124:136].partition(b"\0")[0], 8)
            chksum = int(h[148:156].partition(b"\0")[0], 8)
        except ValueError:  # (a base-256 number too: _octal declines it)
            size_, sum_ = _octal(h[124:136]), _octal(h[148:156])
            if size_ is None or sum_ is None:
                return None
            n, chksum = size_, sum_
        if n < 0:
            return None
        headers += h
        sums.append(chksum)
        name = _name(h[0:100])
        if h[345]:  # the ustar prefix (its first byte not NUL: not empty)
            name = f"{_name(h[345:500])}/{name}"
        pos += BLOCK
        if kind in _REGULAR and not (kind == 0 and name.endswith("/")):  # AREGTYPE "x/": a dir
            data = None
            if name.rpartition("/")[2].partition(".")[2].lower() in wanted:
                if pos + n <= start + len(buf):
                    data = buf[pos - start:pos - start + n]
                else:
                    f.seek(pos)
                    data = f.read(n)
                    if len(data) != n:
                        return None
            members.append(TarMember(name, pos, n, data))
            pos += -(-n // BLOCK) * BLOCK
            if pos > size:
                return None  # the data runs past the end: tarfile says "unexpected end of data"
        elif kind not in _NO_DATA:
            return None  # pax, GNU long name / sparse, or a type tarfile treats otherwise
    if headers:
        # tarfile's unsigned checksum: every byte, the checksum field counted as 8 spaces (a
        # header matching only its signed sum, as some old tars wrote, goes to tarfile); each
        # header's sums accumulated as int64 from the uint8 rows (not a copy of them widened
        # to int64: 8x the headers, ~12 MB a shard of 1,000 items, ~120 MB of 10,000)
        rows = np.frombuffer(headers, np.uint8).reshape(-1, BLOCK)
        got = (rows.sum(axis=1, dtype=np.int64) - rows[:, 148:156].sum(axis=1, dtype=np.int64)
               + 8 * 32)
        if not np.array_equal(got, np.array(sums, dtype=np.int64)):
            return None
    if cut >= 0:
        raise CutShort(cut, members)
    return members

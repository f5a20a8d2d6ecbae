"""Which files a shard source names, and opening one: a file, a folder of ``*<suffix>``
files, a glob (``**`` recursive) or bash-style brace notation (``cc3m-{00000..00331}.tar``),
local or an ``s3://`` / ``gs://`` URI (read through pyarrow's filesystems; the URI's query
string kept on each file). The listing itself: :mod:`components.data.shard_sources`.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from typing import IO, cast

from components.data.sources import SourceError

_GLOB = re.compile(r"[*?\[]")
# A compressed shard's magic bytes -> (its kind, the command that decompresses it)
_PACKED = ((b"\x1f\x8b", "gzip", "gunzip"), (b"BZh", "bzip2", "bunzip2"),
           (b"\xfd7zXZ\x00", "xz", "unxz"), (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"))
# Names a folder's compressed shards have (listed, so they are named as skips, not ignored)
_PACKED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def expand_braces(pattern: str) -> list[str]:
    """Bash-style brace expansion: ``{a,b}`` lists and ``{00000..00331}`` integer ranges
    (zero-padded to the wider end's width when either end has a leading zero), in order;
    several groups multiply (no nesting).

    Raises:
        SourceError: an unbalanced brace, an empty group or a malformed / descending range.
    """
    m = _BRACE.search(pattern)
    if m is None:
        if "{" in pattern or "}" in pattern:
            raise SourceError(f"source.path={pattern!r}: unbalanced brace; write a range as "
                              "{00000..00331} or a list as {a,b}")
        return [pattern]
    body, head, tail = m[1], pattern[: m.start()], pattern[m.end() :]
    if "{" in head or "}" in head:
        raise SourceError(f"source.path={pattern!r}: unbalanced or nested brace; write a range "
                          "as {00000..00331} or a list as {a,b}")
    r = _RANGE.match(body)
    if r is not None:
        lo, hi = int(r[1]), int(r[2])
        if hi < lo:
            raise SourceError(f"source.path={pattern!r}: the range {{{body}}} runs backwards; "
                              f"write {{{r[2]}..{r[1]}}}")
        padded = any(len(s.lstrip("-")) > 1 and s.lstrip("-").startswith("0") for s in r.groups())
        width = max(len(r[1]), len(r[2])) if padded else 0
        parts = [str(i).zfill(width) for i in range(lo, hi + 1)]
    elif "," in body:
        parts = body.split(",")
    else:
        raise SourceError(f"source.path={pattern!r}: the brace group {{{body}}} is neither a "
                          "range {00000..00331} nor a list {a,b}")
    return [head + p + rest for p in parts for rest in expand_braces(tail)]


def _split_uri(path: str) -> tuple[str, str, str]:
    """``(scheme, bucket/key, "?query" or "")`` of an object-store URI."""
    scheme, _, rest = path.partition("://")
    inner, q, query = rest.partition("?")
    return scheme, inner, q + query


def _uri_files(pattern: str, suffix: str) -> list[str]:
    """The objects a URI names: itself, a 'folder''s ``*<suffix>`` objects or a glob's."""
    import pyarrow.fs as pafs

    scheme, inner, query = _split_uri(pattern)
    folder, _, name = inner.rpartition("/")
    fs, _ = pafs.FileSystem.from_uri(f"{scheme}://{folder or inner}{query}")
    if _GLOB.search(inner):
        infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        found = [i.path for i in infos if i.type == pafs.FileType.File
                 and fnmatch.fnmatchcase(i.path.rpartition("/")[2], name)]
    else:
        info = fs.get_file_info(inner)
        if info.type == pafs.FileType.Directory:
            infos = fs.get_file_info(pafs.FileSelector(inner))
            found = [i.path for i in infos if i.type == pafs.FileType.File
                     and is_shard_name(i.path.rpartition("/")[2], suffix)]
        else:
            found = [inner]  # a missing one is an unreadable shard, named when opened
    return [f"{scheme}://{p}{query}" for p in sorted(found)]


def is_shard_name(name: str, suffix: str) -> bool:
    """Whether a folder's file ``name`` is one of its shards: ``*<suffix>``, or a compressed
    one (``.tar.gz``, ``.tgz``, ``.parquet.zst`` ...), listed so that it is named as an
    unreadable shard (:func:`packed`) instead of left out without a word."""
    low = name.lower()
    return (low.endswith(suffix) or low.endswith(tuple(suffix + p for p in _PACKED_SUFFIXES))
            or (suffix == ".tar" and low.endswith(".tgz")))


def packed(f: IO[bytes]) -> str | None:
    """Why the shard ``f`` (at its start; left there) cannot be read in place when it is
    compressed (gzip, bzip2, xz, zstd by their magic bytes), naming the command that
    decompresses it; ``None``: not compressed."""
    head = f.read(6)
    f.seek(0)
    for magic, kind, command in _PACKED:
        if head.startswith(magic):
            return (f"a {kind}-compressed file: shards are read in place, item by item at "
                    f"their offsets, which needs them uncompressed; decompress it first "
                    f"(`{command}`, or write the shards uncompressed)")
    return None


def shard_files(path: str, suffix: str) -> list[str]:
    """The shard files ``path`` names: a file, a folder (its ``*<suffix>`` files), a glob
    (``**`` recursive) or brace notation (:func:`expand_braces`) — local or a URI (its query
    string kept on each). Folders and globs are sorted; brace lists keep their order.

    Raises:
        SourceError: a malformed brace, or nothing matched.
    """
    out: list[str] = []
    for pattern in expand_braces(path):
        if "://" in pattern:
            out += _uri_files(pattern, suffix)
        elif _GLOB.search(pattern):
            out += sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
        elif os.path.isdir(pattern):
            out += sorted(os.path.join(pattern, n) for n in os.listdir(pattern)
                          if is_shard_name(n, suffix) and not n.startswith(".")
                          and os.path.isfile(os.path.join(pattern, n)))
        else:
            out.append(pattern)  # a missing one is an unreadable shard, named when opened
    if len(out) == 1 and out[0] == path and not _GLOB.search(path) and not _exists(path):
        raise SourceError(f"source.path={path!r} does not exist: give a folder of {suffix} "
                          f"files, a file, a glob (/data/*{suffix}) or a brace range "
                          f"(shard-{{00000..00099}}{suffix})")
    if not out:
        raise SourceError(f"source.path={path!r} matches no {suffix} file: give a folder of "
                          f"{suffix} files, a file, a glob (/data/*{suffix}) or a brace range "
                          f"(shard-{{00000..00099}}{suffix})")
    return list(dict.fromkeys(out))


def _exists(path: str) -> bool:
    if "://" not in path:
        return os.path.exists(path)
    import pyarrow.fs as pafs

    fs, inner = pafs.FileSystem.from_uri(path)
    return bool(fs.get_file_info(inner).type != pafs.FileType.NotFound)


def open_shard(path: str) -> IO[bytes]:
    """A seekable binary file: local, or a pyarrow input file for a URI."""
    if "://" not in path:
        return open(path, "rb")
    import pyarrow.fs as pafs

    fs, inner = pafs.FileSystem.from_uri(path)
    return cast(IO[bytes], fs.open_input_file(inner))

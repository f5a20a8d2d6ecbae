"""Local files written whole or not at all, and their hashes: the one place for both.

Every file simgraph writes that a later step trusts (shards and their sidecars, manifests,
caches, checkpoints, metrics) goes through :func:`replacing` / :func:`atomic_open`: written
under a temporary sibling name, flushed to disk, then renamed over the target with
``os.replace`` (atomic within a directory on POSIX). A process killed mid-write leaves at most
a ``.*.tmp*`` file, never a partial file under the final name. Remote (URI) writes go through
:mod:`components.storage`, which uses these for its local side.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

_BLOCK = 1 << 22  # 4 MiB reads for hashing


def temporary_sibling(target: str | os.PathLike[str]) -> Path:
    """A unique hidden name beside ``target`` (same directory, so the rename is atomic) that
    keeps its suffix: ``np.save`` / ``np.savez`` append ``.npy`` / ``.npz`` to names without
    it, and would write somewhere else."""
    t = Path(target)
    return t.with_name(f".{t.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp{t.suffix}")


_TEMPORARY = re.compile(r"^\..+\.\d+\.[0-9a-f]{8}\.tmp(\.[^.]*)?$")


def remove_temporaries(directory: str | os.PathLike[str]) -> int:
    """Delete the :func:`temporary_sibling` files a killed writer left in ``directory`` (not
    recursive); returns how many. Call it only where no other process writes (under the
    directory's lock): a live writer's temporary would go too."""
    d = Path(directory)
    if not d.is_dir():
        return 0
    stale = [p for p in d.iterdir() if p.is_file() and _TEMPORARY.match(p.name)]
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


@contextlib.contextmanager
def replacing(target: str | os.PathLike[str], fsync: bool = True) -> Iterator[Path]:
    """A temporary path to write ``target``'s new content to (by any writer: ``torch.save``,
    ``np.save``, FFCV's writer, ``shutil.copyfile``); when the block succeeds it is synced
    (``fsync``) and renamed over ``target``, otherwise removed. Parent directories are
    created.

    Example::

        with replacing(run / "state.pt") as tmp:
            torch.save(state, tmp)
    """
    t = Path(target)
    t.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(t)
    try:
        yield tmp
        if fsync:
            _fsync(tmp)
        os.replace(tmp, t)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_open(target: str | os.PathLike[str], mode: str = "w",
                **kwargs: Any) -> Iterator[IO[Any]]:
    """``open(target, mode)`` that publishes the file only when the block succeeds (see
    :func:`replacing`). ``mode`` is ``w`` or ``wb`` (with ``newline=``, ``encoding=``...)."""
    if not mode.startswith("w") or "+" in mode:
        raise ValueError(f"atomic_open mode={mode!r}: use a write mode ('w', 'wb'); appending "
                         "or reading cannot be made atomic by a rename")
    with replacing(target) as tmp, open(tmp, mode, **kwargs) as f:
        yield f


def write_text(target: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``target`` atomically."""
    with atomic_open(target, "w", encoding="utf-8") as f:
        f.write(text)


def write_json(target: str | os.PathLike[str], data: Any, indent: int | None = 1) -> None:
    """Write ``data`` as JSON (plus a newline) to ``target`` atomically."""
    write_text(target, json.dumps(data, indent=indent) + "\n")


def sha256_file(path: str | os.PathLike[str], block: int = _BLOCK) -> str:
    """The sha256 (hex) of a local file's bytes, read in ``block``-byte pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()

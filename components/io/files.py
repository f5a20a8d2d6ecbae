"""Local files written whole or not at all, and their hashes: the one place for both.

Every file simgraph writes that a later step trusts (shards and their sidecars, manifests,
caches, checkpoints, metrics) goes through :func:`replacing` / :func:`atomic_open`: written
under a temporary sibling name, flushed to disk, then renamed over the target with
``os.replace`` (atomic within a directory on POSIX). A process killed mid-write leaves at most
a ``.*.tmp*`` file, never a partial file under the final name. Remote (URI) writes go through
:mod:`components.io.storage`, which uses these for its local side.
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


def stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    """What a cache keyed on a file's metadata compares: size, mtime_ns, inode and ctime_ns.
    ``rsync -t`` / ``tar`` / ``cp -p`` restore size and mtime over new content; the inode (a
    replaced file) and the ctime (set by the kernel on every write or rename, never restorable
    by a user) change with it."""
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def sha256_file(path: str | os.PathLike[str], block: int = _BLOCK) -> str:
    """The sha256 (hex) of a local file's bytes, read in ``block``-byte pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# One writer per directory: a lock file naming its holder.
#
# The lock is an exclusive ``fcntl.flock`` on a small JSON file (released by the kernel when
# its holder dies; on NFS the client maps it to a POSIX lock the server arbitrates, so it
# holds across the hosts of a shared filesystem). While held, the file names the holder:
#
#   {"host": ..., "pid": ..., "started": "<when it took the lock, local ISO time>",
#    "process_start": "<the pid's start time in clock ticks since boot (/proc), or null>"}
#
# and it is emptied when released. A lock whose flock is free but whose file still names a
# live process of this host (same pid *and* start time: a reused pid is not the holder) is
# held too — the lock file was replaced under a live holder, or its holder records itself
# another way; one naming a dead process (killed before it could empty the file) is taken
# over, saying so.


class LockHeld(RuntimeError):
    """A directory's lock is held by a live writer (the message names it); callers re-raise
    it as their command's error."""


def _proc_stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after ``pid (comm)`` (state first), or ``None``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()  # comm may hold spaces and parentheses


def process_start(pid: int) -> str | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field
    22), or ``None`` when it is not running or there is no ``/proc``: with the pid, it names a
    process uniquely (a pid is reused, its start time is not)."""
    fields = _proc_stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def lock_record() -> dict[str, Any]:
    """What this process writes into a lock it takes."""
    import socket
    import time

    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "process_start": process_start(os.getpid())}


def read_lock(lock_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The holder record in ``lock_path``; ``None`` when it is empty, missing or not one."""
    try:
        data = json.loads(Path(lock_path).read_text()[:2000])
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "pid" in data else None


def describe_holder(record: dict[str, Any] | None) -> str:
    """``pid 123 on host-a since 2026-11-26T14:03:38``."""
    if record is None:
        return "a process that did not say who it is"
    return (f"pid {str(record.get('pid'))[:20]} on {str(record.get('host'))[:80]} since "
            f"{str(record.get('started'))[:40]}")


def holder_alive(record: dict[str, Any]) -> bool | None:
    """Whether the process ``record`` names still runs: ``None`` when it ran on another host
    (not knowable from here), ``False`` when its pid is gone, is a zombie (killed, not yet
    reaped by its parent) or now belongs to a process that started at another time."""
    import socket

    if record.get("host") != socket.gethostname():
        return None
    try:
        pid = int(record["pid"])
        if pid <= 0:
            return False
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        pass
    except (KeyError, TypeError, ValueError, OverflowError):
        return False
    fields = _proc_stat(pid)
    if fields is not None and fields[0] in ("Z", "X"):  # exited, not yet reaped by its parent
        return False
    want, now = record.get("process_start"), process_start(pid)
    return not (want is not None and now is not None and str(want) != now)


@contextlib.contextmanager
def holding(lock_path: str | os.PathLike[str], what: str, *, wait_s: float = 0.0,
            report_s: float = 60.0, refusal: str = "", waiting: str = "",
            ) -> Iterator[dict[str, Any] | None]:
    """Hold the lock ``lock_path`` (created if missing) for the block; yields the record of a
    dead holder it took over (``None`` normally) after saying so on stderr.

    ``what`` names the lock in messages ("the run dir /r/a"). A held lock is waited for
    ``wait_s`` seconds (0: refused at once), saying who holds it every ``report_s`` seconds.

    Raises:
        LockHeld: still held after ``wait_s``: one line naming ``what``, the holder (host, pid,
            since) and ``refusal`` (what to do), or for a wait, ``waiting``.
    """
    import fcntl
    import sys
    import time

    path = Path(lock_path)
    with open(path, "a+") as f:
        start = next_report = time.monotonic()
        while True:
            record = None
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                record = read_lock(path)
                if record is None or holder_alive(record) is not True:
                    break
                fcntl.flock(f, fcntl.LOCK_UN)  # a live holder on another copy of the file
            except BlockingIOError:
                record = read_lock(path)
            now = time.monotonic()
            if now - start >= wait_s:
                grace = now + 2.0  # a holder that has just taken it writes its record next
                while record is None and time.monotonic() < grace:
                    time.sleep(0.02)
                    record = read_lock(path)
                who = describe_holder(record)
                if wait_s > 0:
                    raise LockHeld(f"gave up after {wait_s:g} s waiting for {what}, held by "
                                   f"{who}{': ' + waiting if waiting else ''}") from None
                raise LockHeld(f"{what} is held by {who}"
                               f"{': ' + refusal if refusal else ''}") from None
            if now >= next_report:
                print(f"simgraph: waiting for {what}, held by {describe_holder(record)} "
                      f"({now - start:.0f} s of {wait_s:g} s)", file=sys.stderr, flush=True)
                next_report = now + report_s
            time.sleep(min(0.2, max(0.0, wait_s - (now - start))))
        if record is not None:
            alive = holder_alive(record)
            why = (" (that process is no longer running)" if alive is False else
                   " (it ran on another host and its lock was released)")
            print(f"simgraph: taking over {what} from {describe_holder(record)}{why}",
                  file=sys.stderr, flush=True)
        try:
            f.seek(0)
            f.truncate()
            f.write(json.dumps(lock_record()))
            f.flush()
            yield record
        finally:
            with contextlib.suppress(OSError):
                f.seek(0)
                f.truncate()
                f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)

"""Copy a preprocessed dataset dir to node-local disk, once per node.

FFCV reads ``<split>.beton`` with memory maps and random access: fine on local disk, slow on a
shared filesystem, impossible from ``s3://`` / ``gs://``. :func:`stage_dataset` copies what the
reader needs — ``manifest.json``, each non-empty split's file and the ``class_files`` — to

    <cache_dir>/<dataset dir name>-<first 12 hex of the manifest's params_digest>

where ``cache_dir`` is the argument, else ``$SIMGRAPH_STAGE_DIR``, else
``<tempdir>/simgraph-stage-<uid>``. (A manifest without ``params_digest`` uses the sha256 of
the manifest itself.)

* **Per user.** The default folder is created owner-only (0700) and refused when it belongs
  to another user, is a symlink, or is writable by its group or others: another local user
  could otherwise plant a dataset there (:func:`default_cache_dir`).
* **Once per node.** Every worker of a node may call it: an exclusive ``fcntl.flock`` on
  ``<destination>.lock`` lets one process copy while the others wait, then find the copy
  complete and reuse it. The holder writes its host, pid and start time into the lock file;
  a waiter says who holds it every :data:`LOCK_REPORT_S` seconds and gives up after
  ``$SIMGRAPH_LOCK_TIMEOUT`` seconds (default :data:`LOCK_TIMEOUT_S`) with one line naming the
  lock and its holder.
* **Verified.** Each split file's sha256 is computed while it streams and compared with the
  manifest's; a mismatch removes the partial copy and raises :class:`DatasetError` naming the
  file and both digests.
* **Complete or redone.** ``.staged`` (JSON: the manifest's sha256, every file's size and its
  size / mtime_ns / inode / ctime_ns right after its verified copy) is written last. A
  destination is reused only when the marker matches the source manifest byte-for-byte and
  every file is still the one verified (a stat per file: any write since changes the ctime,
  even one that keeps the size and mtime); otherwise (a killed copy, a truncated or rewritten
  file, a re-preprocessed source) it is deleted and copied again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from components.data.reader import FORMAT, MANIFEST, DatasetError
from components.io import storage
from components.io.files import LockHeld, atomic_open, holding, stat_key, write_json

STAGE_ENV = "SIMGRAPH_STAGE_DIR"
MARKER = ".staged"
LOCK_TIMEOUT_ENV = "SIMGRAPH_LOCK_TIMEOUT"
LOCK_TIMEOUT_S = 3600.0  # copying a large dataset from an object store takes minutes, not hours
LOCK_REPORT_S = 60.0

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageResult:
    """What :func:`stage_dataset_report` did."""

    path: Path  # the local dataset dir
    copied: bool  # False: an existing complete copy was reused
    files: int  # files copied (0 when reused)
    bytes_copied: int
    seconds: float


def default_cache_dir() -> Path:
    """``$SIMGRAPH_STAGE_DIR``, else ``<tempdir>/simgraph-stage-<uid>``, created owner-only.

    Raises:
        DatasetError: the per-user default is a symlink, belongs to another user, or is
            writable by its group or others (naming the folder and the fix).
    """
    env = os.environ.get(STAGE_ENV)
    if env:
        return Path(env).expanduser()
    uid = os.getuid()
    root = Path(tempfile.gettempdir()) / f"simgraph-stage-{uid}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o700)
    st = os.lstat(root)
    fix = f"remove it, or set {STAGE_ENV} to a folder of your own"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise DatasetError(f"the staging folder {root} is not a plain folder (a symlink?): {fix}")
    if st.st_uid != uid:
        raise DatasetError(f"the staging folder {root} belongs to uid {st.st_uid}, not you (uid "
                           f"{uid}): another user may have planted datasets there; {fix}")
    if st.st_mode & 0o022:
        raise DatasetError(
            f"the staging folder {root} is writable by its group or others (mode "
            f"{oct(stat.S_IMODE(st.st_mode))}): another user could plant a dataset there; run "
            f"`chmod 700 {root}`, or set {STAGE_ENV} to a folder of your own")
    return root


def stage_dataset(src: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Local copy of the dataset dir ``src`` (path or URI); see the module docstring.

    Raises:
        DatasetError: no complete manifest at ``src``, a file it names is missing, or a split
            file's sha256 differs from the manifest's.
    """
    return stage_dataset_report(src, cache_dir).path


def stage_dataset_report(src: str | Path, cache_dir: str | Path | None = None) -> StageResult:
    """:func:`stage_dataset`, returning what was done (copied or reused, bytes, time)."""
    t0 = time.monotonic()
    src = str(src)
    raw, manifest = _read_manifest(src)
    manifest_sha = hashlib.sha256(raw).hexdigest()
    key = str(manifest.get("params_digest") or manifest_sha)[:12]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", storage.basename(src)) or "dataset"
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    dest = root / f"{name}-{key}"
    files = _files(manifest)

    with _locked(root / f"{dest.name}.lock"):
        if _complete(dest, raw, manifest_sha):
            result = StageResult(path=dest, copied=False, files=0, bytes_copied=0,
                                 seconds=time.monotonic() - t0)
            log.info("stage %s: reusing %s", storage.display(src), dest)
            return result
        if dest.exists():
            log.info("stage %s: removing incomplete or stale %s", storage.display(src), dest)
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        try:
            sizes = _copy(src, dest, files)
            (dest / MANIFEST).write_bytes(raw)
            sizes[MANIFEST] = len(raw)
            _write_marker(dest, {"manifest_sha256": manifest_sha, "source": storage.display(src),
                                 "files": sizes, "stat": _stats(dest, sizes)})
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
    total = sum(sizes.values())
    result = StageResult(path=dest, copied=True, files=len(sizes), bytes_copied=total,
                         seconds=time.monotonic() - t0)
    log.info("stage %s: copied %d files, %d bytes to %s in %.1f s", storage.display(src),
             result.files, total, dest, result.seconds)
    return result


def _read_manifest(src: str) -> tuple[bytes, dict[str, Any]]:
    path = storage.join(src, MANIFEST)
    shown = storage.display(path)
    try:
        raw = storage.read_bytes(path)
    except storage.StorageNotFoundError:
        raise DatasetError(
            f"{storage.display(src)} has no {MANIFEST}: run `simgraph preprocess` for it "
            "first (or let an interrupted run finish)"
        ) from None
    except storage.StorageError as e:
        raise DatasetError(f"cannot read {shown}: {e}") from None
    try:
        manifest = json.loads(raw)
    except ValueError as e:
        raise DatasetError(f"cannot read {shown}: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not manifest.get(
        "complete"
    ):
        m = manifest if isinstance(manifest, dict) else {}
        raise DatasetError(
            f"{shown} is not a complete {FORMAT} dataset (format {m.get('format')!r}, "
            f"complete={m.get('complete')}); re-run preprocessing"
        )
    return raw, manifest


def _files(manifest: dict[str, Any]) -> dict[str, str | None]:
    """Relative file name → expected sha256 (``None``: not recorded) of what the reader needs."""
    out: dict[str, str | None] = {}
    for split in manifest.get("splits", {}).values():
        if int(split.get("samples") or 0) > 0:
            out[str(split["file"])] = split.get("sha256")
    for name in manifest.get("class_files", {}).values():
        out.setdefault(str(name), None)
    for name in out:
        if name.startswith("/") or ".." in Path(name).parts or name in (MANIFEST, MARKER):
            raise DatasetError(f"{MANIFEST} names {name!r}: not a file inside the dataset dir")
    return out


def lock_timeout() -> float:
    """Seconds a staging-lock wait lasts: ``$SIMGRAPH_LOCK_TIMEOUT``, else
    :data:`LOCK_TIMEOUT_S`."""
    raw = os.environ.get(LOCK_TIMEOUT_ENV, "").strip()
    try:
        return float(raw) if raw else LOCK_TIMEOUT_S
    except ValueError:
        raise DatasetError(f"{LOCK_TIMEOUT_ENV}={raw[:40]!r} is not a number of seconds") from None


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Exclusive lock for the duration (:func:`components.io.files.holding`: released if the
    process dies, names its holder); a wait says who holds it and gives up after
    :func:`lock_timeout` (module docstring)."""
    timeout = lock_timeout()
    try:
        with holding(lock_path, f"the staging lock {lock_path}", wait_s=timeout,
                     report_s=LOCK_REPORT_S,
                     waiting=f"if that process is stuck, stop it; else wait longer "
                             f"({LOCK_TIMEOUT_ENV}=SECONDS)"):
            yield
    except LockHeld as e:
        raise DatasetError(str(e)) from None


def _stats(dest: Path, files: dict[str, int]) -> dict[str, list[int]]:
    """Each staged file's :func:`~components.io.files.stat_key` right after its verified copy."""
    return {n: list(stat_key((dest / n).stat())) for n in files}


def _complete(dest: Path, raw: bytes, manifest_sha: str) -> bool:
    """A finished copy of exactly this manifest whose files are still the ones copied and
    verified: each file's size, mtime_ns, inode and ctime_ns as recorded right after its
    sha256 was checked (a file written since, even with its size and mtime kept, has another
    ctime; checking this costs a stat per file, not a hash). A marker without them (an older
    simgraph's) is not trusted: the copy is redone once."""
    try:
        marker = json.loads((dest / MARKER).read_text())
        if marker.get("manifest_sha256") != manifest_sha or (dest / MANIFEST).read_bytes() != raw:
            return False
        stats = marker["stat"]
        return set(stats) == set(marker["files"]) and all(
            list(stat_key((dest / n).stat())) == key for n, key in stats.items())
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return False


def _copy(src: str, dest: Path, files: dict[str, str | None]) -> dict[str, int]:
    """Download ``files`` in parallel, verifying sha256 where the manifest has one."""

    def one(name: str) -> tuple[str, int]:
        remote = storage.join(src, name)
        try:
            got = storage.download_file(remote, dest / name)
        except storage.StorageError as e:
            raise DatasetError(f"cannot stage {storage.display(remote)}, which {MANIFEST} "
                               f"names: {e}") from None
        want = files[name]
        if want is not None and got != want:
            raise DatasetError(
                f"{storage.display(remote)}: sha256 {got} does not match {want} in {MANIFEST}; "
                "the source is corrupted or changed while copying (the partial copy was removed)"
            )
        return name, (dest / name).stat().st_size

    if not files:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(files))) as pool:
        return dict(pool.map(one, sorted(files)))


def _write_marker(dest: Path, data: dict[str, Any]) -> None:
    write_json(dest / MARKER, data)


def dataset_info(src: str | Path) -> Any:
    """:class:`~components.data.reader.DatasetInfo` of ``src`` without copying its splits: a
    local dir is read in place; for a URI only ``manifest.json`` and the ``class_files`` (a few
    KB) are fetched, into ``<cache>/info/<hash of the URI>``. For driver-side checks; workers
    read a :func:`local_dataset`.

    Raises:
        DatasetError: as :func:`stage_dataset`.
    """
    from components.data.reader import DatasetInfo

    src = str(src)
    if not storage.is_uri(src):
        return DatasetInfo.load(src)
    raw, manifest = _read_manifest(src)
    dest = default_cache_dir() / "info" / hashlib.sha256(src.encode()).hexdigest()[:16]
    dest.mkdir(parents=True, exist_ok=True)
    _files(manifest)  # refuses file names outside the dataset dir
    for name in manifest.get("class_files", {}).values():
        storage.download_file(storage.join(src, str(name)), dest / str(name))
    with atomic_open(dest / MANIFEST, "wb") as f:  # other processes may be reading it
        f.write(raw)
    return DatasetInfo.load(dest)


def local_dataset(src: str | Path, stage: bool, cache_dir: str | Path | None = None) -> Path:
    """Where a worker reads the dataset ``src`` from: a staged node-local copy when ``stage``
    is set or ``src`` is a URI (FFCV cannot read object stores), else ``src`` itself."""
    if stage or storage.is_uri(str(src)):
        return stage_dataset(src, cache_dir)
    return Path(src)

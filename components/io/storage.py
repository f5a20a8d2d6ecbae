"""Run, sweep and dataset dirs on local/shared disk or in object stores, one API for both.

A *path* here is either

* a local or shared-filesystem path (``/shared/runs``, ``runs/a``, ``~/data``): made absolute
  against the working directory and used through ``pyarrow.fs.LocalFileSystem``; or
* a URI ``s3://bucket/prefix``, ``gs://bucket/prefix`` (``gcs://`` is the same),
  ``file:///abs/path``: resolved with ``pyarrow.fs.FileSystem.from_uri``, exactly as Ray Train's
  ``StorageContext`` resolves ``RunConfig(storage_path=...)``, so one string means the same
  place to simgraph and to Ray.

Any other scheme (``hdfs://``, ``http://``, ...) raises :class:`StorageError`.

Filesystem options ride in the URI's query string, as in Ray
(``ray.air._internal.uri_utils.URI``), and :func:`join` keeps them at the end::

    s3://bucket/runs?endpoint_override=127.0.0.1:9000&scheme=http     (MinIO, moto, Ceph ...)
    s3://bucket/runs?region=eu-west-1

pyarrow accepts for S3 ``region``, ``scheme``, ``endpoint_override``, ``allow_bucket_creation``,
``allow_bucket_deletion``, ``allow_delayed_open`` (and a few TLS options); an unknown key is an
error. Credentials come from the usual places (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``,
``~/.aws``, instance metadata; ``GOOGLE_APPLICATION_CREDENTIALS`` for GCS). Without a query
string the endpoint may also come from ``AWS_ENDPOINT_URL`` (``AWS_ENDPOINT_URL_S3``), which the
AWS SDK inside pyarrow reads.

S3 URIs are opened with ``allow_delayed_open=true`` unless the URI sets it, so a small file is
written with one ``PutObject`` instead of a three-request multipart upload. Either way an object
appears whole or not at all. Local writes (:func:`write_text`, :func:`write_bytes`,
:func:`download_file`) go to a temporary name in the same directory and are renamed into place.

Errors from pyarrow (no such bucket, no credentials, a directory where a file was expected) are
raised as :class:`StorageError` naming the path (with any ``user:secret@`` removed).

Credentials in a URI (``s3://KEY:SECRET@bucket/...``; pyarrow reads them as the access key and
secret) are used but never stored or logged: whatever simgraph writes or logs about a config or
a path goes through :func:`redact` / :func:`redacted` (run and sweep configs, checkpoints,
trackers, job metadata, messages via :func:`display`). What is stored is the URI without them,
so a later command must find the credentials elsewhere: prefer the environment or an instance
role from the start.

:class:`LocalMirror` is for files written by libraries that only write local files (metrics CSV,
TensorBoard events, reports): write under ``mirror.local`` and call ``mirror.sync()``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import pyarrow
import pyarrow.fs as pafs

from components.errors import SimgraphError
from components.io.files import atomic_open, replacing
from components.io.paths import is_uri
from components.redaction import has_credentials, redact, redacted  # noqa: F401 (storage's API)

SCHEMES = ("s3", "gs", "gcs", "file")
"""URI schemes :func:`resolve` accepts; local paths need none."""

_CHUNK = 8 << 20  # streaming block for reads, writes and hashing
_COPY_CHUNK = 64 << 20  # pyarrow.fs.copy_files block (Ray Train uses the same)


class StorageError(SimgraphError, ValueError):
    """A path or URI that cannot be used, or an operation on it that failed."""


class StorageNotFoundError(StorageError):
    """Nothing exists at the path or URI."""


def display(path: str) -> str:
    """``path`` for messages: a URI without ``user:password@`` (:func:`redact`)."""
    return redact(path)


def _scheme(path: str) -> str:
    return urlsplit(path).scheme.lower()


def resolve(path: str | Path) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and the path on it for a local path or a supported URI.

    Raises:
        StorageError: an unsupported scheme, a malformed URI or an option pyarrow rejects.
    """
    path = str(path)
    if not path:
        raise StorageError("empty path: give a local path or an s3:// / gs:// / file:// URI")
    if not is_uri(path):
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(path))
    scheme = _scheme(path)
    if scheme not in SCHEMES:
        raise StorageError(
            f"{display(path)}: unsupported URI scheme {scheme + '://'!r}; use a local or shared "
            f"path, or one of {', '.join(s + '://' for s in SCHEMES)}"
        )
    uri = path
    if scheme == "s3":
        parts = urlsplit(path)
        if "allow_delayed_open" not in dict(parse_qsl(parts.query)):
            query = "&".join(q for q in (parts.query, "allow_delayed_open=true") if q)
            uri = urlunsplit(parts._replace(query=query))
    try:
        fs, fs_path = pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError, pyarrow.ArrowException) as e:
        raise StorageError(f"cannot open {display(path)}: {redact(str(e))}") from None
    return fs, fs_path


def _is_local(fs: pafs.FileSystem) -> bool:
    return isinstance(fs, pafs.LocalFileSystem)


@contextlib.contextmanager
def _errors(path: str, action: str) -> Iterator[None]:
    """pyarrow / OS errors → :class:`StorageError` naming ``path``."""
    try:
        yield
    except StorageError:
        raise
    except FileNotFoundError:
        raise StorageNotFoundError(
            f"{display(path)} not found (while trying to {action} it)") from None
    except (OSError, pyarrow.ArrowException) as e:
        raise StorageError(f"cannot {action} {display(path)}: {redact(str(e))}") from None


def join(base: str | Path, *parts: str) -> str:
    """``base/part/...`` for a local path or a URI; a URI keeps its query string at the end.

    ``join("s3://b/x?endpoint_override=h:1&scheme=http", "run", "a.txt")`` is
    ``"s3://b/x/run/a.txt?endpoint_override=h:1&scheme=http"``. Parts are relative: leading and
    trailing ``/`` are dropped, empty parts skipped.
    """
    base = str(base)
    names = [p.strip("/") for p in parts if p.strip("/")]
    if not is_uri(base):
        return os.path.join(base, *names)
    u = urlsplit(base)
    path = "/".join([u.path.rstrip("/"), *names]) if names else u.path
    return urlunsplit(u._replace(path=path))


def parent(path: str | Path) -> str:
    """The directory holding ``path`` (a URI keeps its query string)."""
    path = str(path)
    if not is_uri(path):
        return os.path.dirname(os.path.abspath(os.path.expanduser(path)))
    u = urlsplit(path)
    return urlunsplit(u._replace(path=u.path.rstrip("/").rsplit("/", 1)[0]))


def basename(path: str | Path) -> str:
    """The last component of a path or URI (the bucket for ``s3://bucket``), without the query."""
    path = str(path)
    if not is_uri(path):
        return os.path.basename(os.path.abspath(os.path.expanduser(path)))
    u = urlsplit(path)
    return u.path.rstrip("/").rsplit("/", 1)[-1] or u.netloc.rsplit("@", 1)[-1]


def exists(path: str | Path) -> bool:
    """A file or directory (for object stores: any object under the prefix) is there."""
    fs, p = resolve(path)
    with _errors(str(path), "look up"):
        return bool(fs.get_file_info(p).type != pafs.FileType.NotFound)


def is_dir(path: str | Path) -> bool:
    fs, p = resolve(path)
    with _errors(str(path), "look up"):
        return bool(fs.get_file_info(p).type == pafs.FileType.Directory)


def read_bytes(path: str | Path) -> bytes:
    """The whole file.

    Raises:
        StorageNotFoundError: nothing at ``path``.
        StorageError: a directory, or unreadable.
    """
    fs, p = resolve(path)
    with _errors(str(path), "read"):
        if fs.get_file_info(p).type == pafs.FileType.Directory:
            raise StorageError(f"cannot read {display(str(path))}: it is a directory")
        with fs.open_input_stream(p) as f:
            return bytes(f.read())


def read_text(path: str | Path, encoding: str = "utf-8") -> str:
    """:func:`read_bytes` decoded."""
    return read_bytes(path).decode(encoding)


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` whole: local via a temporary file + ``os.replace``, object stores as one
    object (a single PUT for small data). Parent directories are created."""
    fs, p = resolve(path)
    with _errors(str(path), "write"):
        if _is_local(fs):
            with atomic_open(p, "wb") as f:
                f.write(data)
            return
        with fs.open_output_stream(p) as out:
            out.write(data)


def write_text(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    """:func:`write_bytes` of ``text`` encoded."""
    write_bytes(path, text.encode(encoding))


def makedirs(path: str | Path) -> None:
    """Create the directory and its parents (no error if it exists)."""
    fs, p = resolve(path)
    with _errors(str(path), "create directory"):
        fs.create_dir(p, recursive=True)


def list_dir(path: str | Path) -> list[str]:
    """Sorted base names of the directory's children; ``[]`` if it does not exist."""
    fs, p = resolve(path)
    with _errors(str(path), "list"):
        if fs.get_file_info(p).type == pafs.FileType.File:
            raise StorageError(f"cannot list {display(str(path))}: it is a file")
        infos = fs.get_file_info(pafs.FileSelector(p, allow_not_found=True, recursive=False))
    return sorted(info.base_name for info in infos)


def delete_dir(path: str | Path) -> None:
    """Delete the directory and everything under it; nothing happens if it does not exist."""
    fs, p = resolve(path)
    with _errors(str(path), "delete"):
        kind = fs.get_file_info(p).type
        if kind == pafs.FileType.NotFound:
            return
        if kind != pafs.FileType.Directory:
            raise StorageError(f"cannot delete {display(str(path))} as a directory: it is a file")
        fs.delete_dir(p)


def _copy_files(
    src: str, dst: str, src_fs: pafs.FileSystem, dst_fs: pafs.FileSystem
) -> None:
    # Ray Train's _pyarrow_fs_copy_files: no threads for uploads to S3
    # (https://github.com/apache/arrow/issues/32372), large chunks.
    use_threads = not isinstance(dst_fs, pafs.S3FileSystem)
    pafs.copy_files(src, dst, source_filesystem=src_fs, destination_filesystem=dst_fs,
                    chunk_size=_COPY_CHUNK, use_threads=use_threads)


def upload_dir(local_dir: str | Path, dest: str | Path) -> None:
    """Copy the tree under ``local_dir`` into ``dest`` (created; existing files overwritten).

    Object stores have no empty directories: empty subdirectories are not recreated there.
    """
    local = os.path.abspath(os.path.expanduser(str(local_dir)))
    if not os.path.isdir(local):
        raise StorageError(f"cannot upload {local}: not a local directory")
    fs, p = resolve(dest)
    with _errors(str(dest), "upload to"):
        fs.create_dir(p, recursive=True)
        _copy_files(local, p, pafs.LocalFileSystem(), fs)


def download_dir(src: str | Path, local_dir: str | Path) -> None:
    """Copy the tree under ``src`` into ``local_dir`` (created; existing files overwritten)."""
    fs, p = resolve(src)
    local = os.path.abspath(os.path.expanduser(str(local_dir)))
    with _errors(str(src), "download"):
        kind = fs.get_file_info(p).type
        if kind == pafs.FileType.NotFound:
            raise FileNotFoundError(p)
        if kind != pafs.FileType.Directory:
            raise StorageError(f"cannot download {display(str(src))} as a directory: "
                               "it is a file (use download_file)")
        os.makedirs(local, exist_ok=True)
        _copy_files(p, local, fs, pafs.LocalFileSystem())


def download_file(src: str | Path, local_path: str | Path) -> str:
    """Copy one file to ``local_path`` (temporary name, fsync, then ``os.replace``: a killed
    copy never leaves a partial file under the final name).

    Returns:
        The sha256 (hex) of the bytes written, computed while streaming.
    """
    fs, p = resolve(src)
    target = os.path.abspath(os.path.expanduser(str(local_path)))
    h = hashlib.sha256()
    with (_errors(str(src), "download"), atomic_open(target, "wb") as out,
          fs.open_input_stream(p) as f):
        while block := f.read(_CHUNK):
            h.update(block)
            out.write(block)
    return h.hexdigest()


def _upload_file(local_path: str, fs: pafs.FileSystem, fs_path: str) -> None:
    with open(local_path, "rb") as f, fs.open_output_stream(fs_path) as out:
        while block := f.read(_CHUNK):
            out.write(block)


def upload_file(local_path: str | Path, dest: str | Path) -> None:
    """Copy one local file to ``dest`` (a path or URI), streamed in blocks; a local ``dest``
    is written under a temporary name and renamed into place."""
    fs, p = resolve(dest)
    if _is_local(fs):
        with replacing(p) as tmp:
            shutil.copyfile(local_path, tmp)
        return
    with _errors(str(dest), "upload"):
        _upload_file(str(local_path), fs, p)


class LocalMirror:
    """Write files locally, publish them to ``dest``.

    ``dest`` a local/shared path: :attr:`local` *is* that directory and :meth:`sync` does
    nothing. ``dest`` a URI: :attr:`local` is a fresh temporary directory (under ``cache_dir``
    if given) and :meth:`sync` uploads every file that is new or whose size or mtime changed
    since the last sync (deletions are not propagated). ``pull=True`` first downloads what
    ``dest`` already holds (e.g. a resumed run appending to ``metrics.csv``).

    Use as a context manager: leaving it syncs once more and removes the temporary directory.
    """

    def __init__(self, dest: str | Path, *, cache_dir: str | Path | None = None,
                 pull: bool = False) -> None:
        self.dest = str(dest)
        self.remote = is_uri(self.dest) and not _is_local(resolve(self.dest)[0])
        self._sent: dict[str, tuple[int, int]] = {}
        if not self.remote:
            self.local = Path(resolve(self.dest)[1])
            self.local.mkdir(parents=True, exist_ok=True)
            return
        if cache_dir is not None:
            Path(cache_dir).mkdir(parents=True, exist_ok=True)
        self.local = Path(tempfile.mkdtemp(prefix="simgraph-mirror-",
                                           dir=None if cache_dir is None else str(cache_dir)))
        if pull and is_dir(self.dest):
            download_dir(self.dest, self.local)
            self._sent = {rel: stamp for rel, stamp in self._scan().items()}

    def _scan(self) -> dict[str, tuple[int, int]]:
        out = {}
        for root, _, files in os.walk(self.local):
            for name in files:
                full = os.path.join(root, name)
                st = os.stat(full)
                out[os.path.relpath(full, self.local).replace(os.sep, "/")] = (
                    st.st_size, st.st_mtime_ns)
        return out

    def sync(self) -> list[str]:
        """Upload what changed; returns the relative paths uploaded (``[]`` for a local dest)."""
        if not self.remote:
            return []
        fs, base = resolve(self.dest)
        sent = []
        for rel, stamp in sorted(self._scan().items()):
            if self._sent.get(rel) == stamp:
                continue
            with _errors(join(self.dest, rel), "upload"):
                _upload_file(str(self.local / rel), fs, f"{base.rstrip('/')}/{rel}")
            self._sent[rel] = stamp
            sent.append(rel)
        return sent

    def close(self) -> None:
        """Final :meth:`sync`, then remove the temporary directory (remote dest only)."""
        if self.remote:
            try:
                self.sync()
            finally:
                shutil.rmtree(self.local, ignore_errors=True)

    def __enter__(self) -> LocalMirror:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# Directories simgraph owns: it writes (and replaces, and deletes) only in those.

OWNER_MARK = ".simgraph-owner.json"
"""Written into a new or empty output dir before anything else (``{"owner": "simgraph",
"kind": ...}``): the dir is simgraph's while its own record of what it holds (a dataset's
``manifest.json``, an export's ``config.json``) does not exist yet — a killed first build or
export is resumed, not refused. Removed once that record is written (:func:`release_dir`)."""


def _names(shown: list[str], limit: int = 6) -> str:
    head = ", ".join(n[:60] for n in shown[:limit])
    return head + (f" and {len(shown) - limit} more" if len(shown) > limit else "")


def claim_dir(path: str | Path, kind: str, recognise: Any = None, *,
              error: type[Exception], command: str, fix: str, mark: bool = True) -> bool:
    """Make ``path`` an output dir of ``kind`` ("dataset", "export") that simgraph may write
    in, or refuse it; returns whether it holds simgraph's output already (``False``: new or
    empty, now marked with :data:`OWNER_MARK`).

    It is simgraph's when it holds :data:`OWNER_MARK` of the same ``kind``, or when
    ``recognise(path, names)`` says its files are simgraph's (a dataset's manifest, an export's
    ``config.json``). A missing or empty dir is claimed (``mark=False``: created, not marked —
    for a run dir, whose ``config.yaml`` is written at once).

    Raises:
        ``error``: ``path`` holds files simgraph did not write (the message names them and
            ``fix``), another kind of simgraph output, or is a file.
    """
    import json

    shown = display(str(path))
    try:
        names = list_dir(path)
        if OWNER_MARK in names:
            try:
                owner = json.loads(read_text(join(path, OWNER_MARK)))
            except (StorageError, ValueError):
                owner = None
            other = owner.get("kind") if isinstance(owner, dict) else None
            if other == kind:
                return True
            raise error(f"{shown} is a simgraph {str(other)[:40]} folder ({OWNER_MARK}): "
                        f"simgraph {command} refuses to write there; {fix}")
        if names and not (recognise is not None and recognise(str(path), names)):
            raise error(f"{shown} is not empty and simgraph did not write it ({_names(names)}): "
                        f"simgraph {command} writes only into a new or empty folder or one it "
                        f"wrote, so nothing there is replaced or deleted; {fix}")
        if names:
            return True
        makedirs(path)
        if mark:
            write_text(join(path, OWNER_MARK),
                       json.dumps({"owner": "simgraph", "kind": kind}) + "\n")
    except StorageError as e:
        raise error(f"cannot use {shown} for a {kind}: {e}") from None
    return False


def release_dir(path: str | Path) -> None:
    """Remove :data:`OWNER_MARK` from ``path`` once its own record is written."""
    fs, p = resolve(join(path, OWNER_MARK))
    with contextlib.suppress(FileNotFoundError, OSError):
        fs.delete_file(p)


def lock_path(directory: str | Path) -> Path:
    """Where the one-writer lock of the run or sweep dir ``directory`` lives: beside it,
    ``<parent>/.<name>.lock`` (the dir's own listing stays as it was). For an object-store URI,
    which has no locks, a file in this user's staging folder keyed on the URI: it keeps out a
    second writer on the same machine only (docs/reliability.md)."""
    fs, p = resolve(directory)
    if _is_local(fs):
        local = Path(p)
        return local.parent / f".{local.name}.lock"
    from components.data.staging import default_cache_dir

    key = hashlib.sha256(redact(str(directory)).encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", basename(directory))[:40]
    return default_cache_dir() / "locks" / f"{name}-{key}.lock"


@contextlib.contextmanager
def writer_lock(directory: str | Path, what: str, *, error: type[Exception],
                refusal: str, wait_s: float = 0.0, waiting: str = "") -> Iterator[None]:
    """Hold the one-writer lock of ``directory`` (:func:`lock_path`) for the block: a second
    writer is refused in one line naming the holder (host, pid, since) and ``refusal``; a dead
    holder's lock is taken over, saying so (:func:`components.io.files.holding`). ``wait_s`` > 0:
    a held lock is waited for that long first (then one line naming the holder and
    ``waiting``).

    Raises:
        ``error``: the lock is held (after ``wait_s``), or cannot be created.
    """
    from components.io.files import LockHeld, holding

    try:
        path = lock_path(directory)
        path.parent.mkdir(parents=True, exist_ok=True)
    except (OSError, StorageError) as e:
        raise error(f"cannot lock {display(str(directory))}: {e}") from None
    try:
        with holding(path, f"{what} {display(str(directory))}", refusal=refusal,
                     wait_s=wait_s, waiting=waiting):
            yield
    except LockHeld as e:
        raise error(str(e)) from None

"""Ray Tune's state in a sweep dir, and whether ``simgraph sweep --resume`` may unpickle it.

``Tuner.restore`` (Ray 2.60) unpickles, from the sweep dir: ``tuner.pkl`` (cloudpickle), the
newest ``experiment_state-*.json`` (JSON with cloudpickle blobs: the trials, the controller),
after copying every top-level ``*.json`` / ``*.pkl`` to its staging dir the newest
``searcher-state-*.pkl`` (the searcher and its wrappers), ``search_gen_state-*.json`` and
``callback-states-*.pkl``; and, building the results, each Tune trial dir's ``error.pkl``.
Unpickling runs code: whoever could write one of those files runs it as the user who resumes.
:func:`state_files` names them all (every top-level ``*.json`` / ``*.pkl``, every ``*.pkl`` one
level down), so nothing Tune adds later under those patterns is missed.

* A local (or shared-filesystem) sweep dir: :func:`check_local` refuses when a state file is
  owned by another user (not root, not this one) or writable by its group or by everyone, or
  when a directory from it up to ``/`` is owned by another user or writable by others without
  the sticky bit (they could replace the file). Group write is allowed when the group is this
  user's private group (named after the user, no other members): the usual umask 002 setup.
* A URI sweep dir (``s3://``, ``gs://``) has no owners to check: :func:`record` writes
  :data:`DIGEST_FILE` (the sha256 of every state file, authenticated with an HMAC under a key
  that only this user can read, :func:`key_path`) whenever a sweep run ends, and
  :func:`check_record` refuses a resume when a state file is not the one recorded, or when
  there is no record this user's key signed (a driver killed before it wrote one, a sweep
  started by someone else or on another machine).

Both checks are skipped with ``simgraph sweep --resume --trust-sweep-dir``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path

from components.errors import SimgraphError

DIGEST_FILE = "state_digest.json"
KEY_FILE = "sweep_state.key"
TUNER_STATE = "tuner.pkl"  # Ray Tune's; no sweep to resume without it
TRUST_FLAG = "--trust-sweep-dir"


class UntrustedSweepState(SimgraphError, RuntimeError):
    """Resuming would unpickle a sweep-dir file that someone else could have written."""


# ---------------------------------------------------------------------------------------------
# Which files.


def state_files(sweep_dir: str) -> list[str]:
    """The files of ``sweep_dir`` (a path or URI) that resuming the sweep may unpickle,
    relative to it (``/``-separated), sorted: top-level ``*.pkl`` and ``*.json`` (except
    :data:`DIGEST_FILE`), and ``*.pkl`` in its direct subdirectories (Tune's trial dirs)."""
    import pyarrow.fs as pafs

    from components.io import storage

    fs, base = storage.resolve(sweep_dir)
    base = base.rstrip("/")
    with storage._errors(sweep_dir, "list"):
        top = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
        out = [i.base_name for i in top if i.type == pafs.FileType.File
               and i.base_name.endswith((".pkl", ".json")) and i.base_name != DIGEST_FILE]
        for d in top:
            if d.type != pafs.FileType.Directory:
                continue
            below = fs.get_file_info(pafs.FileSelector(f"{base}/{d.base_name}",
                                                       allow_not_found=True))
            out += [f"{d.base_name}/{i.base_name}" for i in below
                    if i.type == pafs.FileType.File and i.base_name.endswith(".pkl")]
    return sorted(out)


def has_state(sweep_dir: str) -> bool:
    """Whether ``sweep_dir`` holds a Tune experiment to resume (its ``tuner.pkl``)."""
    from components.io import storage

    return storage.exists(storage.join(sweep_dir, TUNER_STATE))


def _refusal(what: str, why: str, fix: str) -> UntrustedSweepState:
    return UntrustedSweepState(
        f"--resume would unpickle {what} (Ray Tune's saved state), but {why}: whoever can "
        f"write it runs code as you when the sweep resumes. {fix}; if you trust everyone who "
        f"can write there, pass {TRUST_FLAG}")


# ---------------------------------------------------------------------------------------------
# A local sweep dir: owners and modes.


def _private_group(gid: int) -> bool:
    """``gid`` is this user's own group (named after the user, no other members)."""
    import grp
    import pwd

    try:
        user = pwd.getpwuid(os.getuid()).pw_name
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == os.getgid() and group.gr_name == user and set(group.gr_mem) <= {user}


def _exposure(st: os.stat_result, directory: bool) -> str | None:
    """Why someone else could change the file or directory ``st`` describes, or None."""
    if st.st_uid not in (0, os.getuid()):
        return f"owned by another user (uid {st.st_uid})"
    if directory and st.st_mode & stat.S_ISVTX:
        return None  # /tmp-like: others create entries but cannot replace ours
    if st.st_mode & stat.S_IWOTH:
        return "writable by everyone"
    if st.st_mode & stat.S_IWGRP and not _private_group(st.st_gid):
        return f"writable by its group (gid {st.st_gid})"
    return None


def check_local(sweep_dir: str | Path) -> None:
    """Refuse to resume a local sweep dir whose state files (:func:`state_files`) someone else
    could have written: see the module docstring.

    Raises:
        UntrustedSweepState: naming the file or directory, why, and what to do.
    """
    root = Path(os.path.abspath(os.path.expanduser(str(sweep_dir))))
    seen: set[Path] = set()
    for rel in state_files(str(root)):
        given = root / rel
        for path in dict.fromkeys([given, Path(os.path.realpath(given))]):
            why = _exposure(os.stat(path), directory=False)
            if why:
                raise _refusal(str(path), f"it is {why}",
                               f"If you wrote it, make it yours alone (chmod go-w {path})")
            for d in path.parents:
                if d in seen:
                    continue
                seen.add(d)
                why = _exposure(os.stat(d), directory=True)
                if why:
                    raise _refusal(str(path), f"its directory {d} is {why}",
                                   f"Make {d} writable only by you (chmod go-w {d}; chmod +t "
                                   "for a directory others share) or move the sweep dir")


# ---------------------------------------------------------------------------------------------
# A URI sweep dir: an authenticated record of the state files.


def key_path() -> Path:
    """This user's key for :data:`DIGEST_FILE` records:
    ``$XDG_CONFIG_HOME/simgraph/sweep_state.key`` (default ``~/.config``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "simgraph" / KEY_FILE


def _key(create: bool) -> bytes | None:
    path = key_path()
    if not path.exists():
        if not create:
            return None
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another sweep made it meanwhile
            return path.read_bytes().strip()
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    return path.read_bytes().strip()


def _mac(key: bytes, files: dict[str, str]) -> str:
    return hmac.new(key, json.dumps(files, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def digests(sweep_dir: str) -> dict[str, str]:
    """sha256 (hex) of every state file of ``sweep_dir`` (:func:`state_files`)."""
    from components.io import storage

    return {rel: hashlib.sha256(storage.read_bytes(storage.join(sweep_dir, rel))).hexdigest()
            for rel in state_files(sweep_dir)}


def record(sweep_dir: str) -> None:
    """Write :data:`DIGEST_FILE` into ``sweep_dir``: the state files as they are now, signed
    with this user's key (made on first use, readable only by the user)."""
    from components.io import storage

    files = digests(sweep_dir)
    key = _key(create=True)
    assert key is not None
    storage.write_text(storage.join(sweep_dir, DIGEST_FILE),
                       json.dumps({"files": files, "hmac": _mac(key, files)}, indent=1))


def check_record(sweep_dir: str) -> None:
    """Refuse to resume ``sweep_dir`` unless its state files are those :func:`record` wrote
    under this user's key.

    Raises:
        UntrustedSweepState: no record (or not this user's), or a file that differs from it.
    """
    from components.io import storage

    shown = storage.display(sweep_dir)
    path = storage.join(sweep_dir, DIGEST_FILE)
    killed = ("a sweep driver killed before it ended writes none, and a sweep started by "
              "another user or on another machine has none signed by your key")
    if not storage.exists(path):
        raise _refusal(f"the state files in {shown}", f"it has no {DIGEST_FILE} to check them "
                       f"against ({killed})", "Check who could have written them")
    try:
        saved = json.loads(storage.read_text(path))
        files = {str(k): str(v) for k, v in saved["files"].items()}
        mac = str(saved["hmac"])
    except (ValueError, KeyError, TypeError, AttributeError):
        raise _refusal(f"the state files in {shown}", f"its {DIGEST_FILE} is not a record "
                       "simgraph wrote", "Check who could have written them") from None
    key = _key(create=False)
    if key is None or not hmac.compare_digest(mac, _mac(key, files)):
        raise _refusal(f"the state files in {shown}", f"its {DIGEST_FILE} was not signed "
                       f"with your key {key_path()} ({killed}, or it was edited)",
                       "Check who could have written them")
    for rel, digest in digests(sweep_dir).items():
        if files.get(rel) != digest:
            why = ("it is not in the record the last sweep run wrote" if rel not in files
                   else "it changed since the last sweep run recorded it")
            raise _refusal(storage.display(storage.join(sweep_dir, rel)),
                           f"{why} (a sweep driver killed before it ended leaves state newer "
                           "than its record)", "Check who could have written it")


def check(sweep_dir: str) -> None:
    """:func:`check_local` for a local sweep dir (``file://`` included), :func:`check_record`
    for a URI; nothing when there is no Tune state to resume."""
    from components.io import storage

    if not has_state(sweep_dir):
        return  # nothing to unpickle: the sweep's own "nothing to resume" says the rest
    fs, local = storage.resolve(sweep_dir)
    if storage._is_local(fs):
        check_local(local)
    else:
        check_record(sweep_dir)


def is_remote(sweep_dir: str) -> bool:
    """Whether ``sweep_dir`` lies in an object store (what :func:`record` is for)."""
    from components.io import storage

    return not storage._is_local(storage.resolve(sweep_dir)[0])


__all__ = ["DIGEST_FILE", "TRUST_FLAG", "UntrustedSweepState", "check", "check_local",
           "check_record", "digests", "has_state", "is_remote", "key_path", "record",
           "state_files"]

"""Where relative paths in configs point.

A relative dataset, storage or output path means the directory ``simgraph`` was started in —
unless ``SIMGRAPH_BASE_DIR`` is set. A job sent with ``simgraph submit`` runs in a temporary
copy of the project on the cluster, so relative paths there would vanish with the job;
``simgraph submit --base-dir /shared/simgraph`` sets this variable so that they mean a
directory every node shares instead. URIs (``s3://…``, ``gs://…``) are never changed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

BASE_ENV = "SIMGRAPH_BASE_DIR"
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_uri(path: str | Path) -> bool:
    """``scheme://…`` (``s3://``, ``gs://``, ``file://``; :func:`components.io.storage.resolve`
    decides whether the scheme is supported)."""
    return bool(_URI.match(str(path)))


def base_dir() -> Path:
    """``$SIMGRAPH_BASE_DIR`` if set, else the working directory."""
    base = os.environ.get(BASE_ENV)
    return Path(base).expanduser() if base else Path.cwd()


def resolve_path(path: str, base: str | Path | None = None) -> str:
    """``path`` made absolute against ``base`` (default :func:`base_dir`); URIs unchanged."""
    if is_uri(path):
        return path
    root = Path(base) if base is not None else base_dir()
    return str((root / Path(path).expanduser()).resolve())


def is_relative(path: str) -> bool:
    """A local path that depends on the working directory (``~`` counts as absolute)."""
    return not is_uri(path) and not Path(path).expanduser().is_absolute()


PROJECT_PREFIX = "project:"


def project_root() -> Path:
    """The directory holding ``components/`` and ``pipelines/``: the repo, or the copy of it
    that a Ray job's ``working_dir`` unpacked on this node."""
    return Path(__file__).resolve().parents[2]  # components/io/paths.py -> the project


def portable(path: str | Path) -> str:
    """A file path that means the same file on every node of a cluster: files inside the
    project (configs, search spaces) become ``project:<relative path>``, because each node
    unpacks a job's ``working_dir`` into its own directory; others become absolute."""
    p = Path(path).resolve()
    try:
        return PROJECT_PREFIX + str(p.relative_to(project_root()))
    except ValueError:
        return str(p)


def localize(path: str) -> Path:
    """Inverse of :func:`portable` on this node."""
    if path.startswith(PROJECT_PREFIX):
        return project_root() / path[len(PROJECT_PREFIX):]
    return Path(path)

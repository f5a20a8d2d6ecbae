"""Where a sweep lives and the error its commands raise: ``<storage>/<name>``
(:func:`sweep_dir`, a path or URI) and :class:`SweepError`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.errors import SimgraphError


class SweepError(SimgraphError, RuntimeError):
    """The sweep cannot start or its results cannot be read."""


def sweep_dir(sweep: Any, base: str | Path | None = None) -> str:
    """``storage/name`` (a path or URI), a relative storage taken against ``base`` (default:
    :func:`components.io.paths.base_dir`)."""
    from components.io.paths import resolve_path
    from components.io.storage import join

    return join(resolve_path(sweep.storage, base), sweep.name)

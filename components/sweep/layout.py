"""Where a sweep lives and the error its commands raise: ``<storage>/<name>``
(:func:`sweep_dir`, a path or URI), the names of what the sweep writes there that its
stages share (:data:`TRIALS_JSON`, :data:`CONFIRM_DIR`), and :class:`SweepError`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from components.errors import SimgraphError

if TYPE_CHECKING:
    from components.search_space import SweepConfig

TRIALS_JSON = "trials.json"  # the trial rows (typed parameters): what --confirm reads back
CONFIRM_DIR = "confirm"  # <sweep dir>/confirm/<rank>-seed<j>: the confirmation runs


class SweepError(SimgraphError, RuntimeError):
    """The sweep cannot start or its results cannot be read."""


def sweep_dir(sweep: SweepConfig, base: str | Path | None = None) -> str:
    """``storage/name`` (a path or URI), a relative storage taken against ``base`` (default:
    :func:`components.io.paths.base_dir`)."""
    from components.io.paths import resolve_path
    from components.io.storage import join

    return join(resolve_path(sweep.storage, base), sweep.name)


def trials_dir(sweep: SweepConfig, base: str | Path | None = None) -> str:
    """``<sweep dir>/trials``: the storage of the trials' run dirs (each named by its trial
    id)."""
    from components.io.storage import join

    return join(sweep_dir(sweep, base), "trials")

"""The error of a run that cannot start or did not finish (:class:`RunError`), raised by every
module of :mod:`components.runs`: the run dir, its dataset and resume checks, the driver and
the worker loop. Defined below them all so that each can raise it without importing another
(``components.runs.run_dir.RunError`` is the same class: older pickles of it name that
module)."""

from __future__ import annotations

from components.errors import SimgraphError


class RunError(SimgraphError, RuntimeError):
    """The run cannot start or did not finish; the message says why and what to do."""

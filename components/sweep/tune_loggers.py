"""Ray Tune's TensorBoard logger without its start-up cost.

``Tuner.fit`` adds Tune's ``TBXLoggerCallback`` when none is given, and that callback imports
tensorboardX — and, through it, torch — in its constructor: ~1.2 s in a sweep driver on a
2-core CPU, spent before Tune schedules the first trial. :class:`DeferredTBXLoggerCallback`
writes the same files (each Tune trial dir gets the trial's reported scalars and, once it ends,
its HParams) but imports tensorboardX in a background thread from the first trial's start and
opens a trial's writer at its first result, so nothing waits for the import.

:func:`use_deferred_tensorboard` hands it to Tune through ``RAY_TUNE_CALLBACKS`` (Tune's own
hook for callbacks named in the environment), not ``RunConfig(callbacks=...)``: Tune's usage
telemetry imports its MLflow, W&B, Comet and Aim integrations (~1 s more) whenever the
RunConfig names any callback. Tune adds no TBX logger of its own when one is present.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from ray.tune.constants import RAY_TUNE_CALLBACKS_ENV_VAR
from ray.tune.logger import TBXLoggerCallback


def _import_tensorboardx() -> None:
    with contextlib.suppress(Exception):  # a failure is raised again where the writer opens
        import tensorboardX  # noqa: F401


class DeferredTBXLoggerCallback(TBXLoggerCallback):
    """``TBXLoggerCallback`` that never makes Tune wait for the tensorboardX import.

    Tune calls ``log_trial_start`` before the trial trains; here it only starts the import
    (once) and drops a restarted trial's old writer. The writer opens at the trial's first
    result, as ``TBXLoggerCallback.log_trial_result`` does for a trial it has not seen.

    Raises:
        ImportError: at the first result, when tensorboardX is missing (``ray[tune]`` ships
            it).
    """

    def __init__(self) -> None:
        # TBXLoggerCallback.__init__ sets the last three, importing tensorboardX for the first.
        self._import: threading.Thread | None = None
        self._summary_writer_cls: Any = None
        self._trial_writer: dict[Any, Any] = {}
        self._trial_result: dict[Any, dict[str, Any]] = {}

    def log_trial_start(self, trial: Any) -> None:
        if self._import is None:
            self._import = threading.Thread(target=_import_tensorboardx, daemon=True,
                                            name="simgraph-import-tensorboardx")
            self._import.start()
        if trial in self._trial_writer:  # restarted: a new events file from its next result
            self._trial_writer.pop(trial).close()
            self._trial_result.pop(trial, None)

    def log_trial_result(self, iteration: int, trial: Any, result: dict[str, Any]) -> None:
        if trial not in self._trial_writer:
            if self._summary_writer_cls is None:
                from tensorboardX import SummaryWriter  # waits for the background import

                self._summary_writer_cls = SummaryWriter
            super().log_trial_start(trial)
        super().log_trial_result(iteration, trial, result)


def use_deferred_tensorboard() -> None:
    """Name :class:`DeferredTBXLoggerCallback` in ``RAY_TUNE_CALLBACKS`` (keeping any callbacks
    already named there) for the ``Tuner.fit`` calls of this process."""
    name = f"{DeferredTBXLoggerCallback.__module__}.{DeferredTBXLoggerCallback.__qualname__}"
    named = [c.strip() for c in os.environ.get(RAY_TUNE_CALLBACKS_ENV_VAR, "").split(",")
             if c.strip()]
    if name not in named:
        os.environ[RAY_TUNE_CALLBACKS_ENV_VAR] = ",".join([*named, name])


__all__ = ["DeferredTBXLoggerCallback", "use_deferred_tensorboard"]

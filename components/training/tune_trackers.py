"""Ray Tune's MLflow and W&B callbacks for a sweep
(:func:`components.training.tracking.tune_callbacks`),
logging each trial's parameters without the credentials of any URI among them
(:func:`components.io.storage.redacted`): a swept ``data.dataset: {choice: [s3://KEY:SECRET@...]}``
reaches the trials, never the trackers.

:data:`RedactingMLflowLoggerCallback` / :data:`RedactingWandbLoggerCallback` are made on first
access (module ``__getattr__``): Ray's integration module of a tracker imports the tracker's
package, which need not be installed when the sweep does not use it. They are module
attributes all the same, so Tune pickles them by reference into the sweep's state for
``--resume`` and unpickling makes them again.
"""

from __future__ import annotations

from typing import Any

from components.io.storage import redacted

_BASES = {
    "RedactingMLflowLoggerCallback": ("ray.air.integrations.mlflow", "MLflowLoggerCallback"),
    "RedactingWandbLoggerCallback": ("ray.air.integrations.wandb", "WandbLoggerCallback"),
}


def _redacting(name: str) -> type:
    import importlib

    module, base_name = _BASES[name]
    base: Any = getattr(importlib.import_module(module), base_name)

    class Redacting(base):  # type: ignore[misc, valid-type]
        def log_trial_start(self, trial: Any) -> None:
            """Ray's, with ``trial.config`` redacted while it runs: both of Ray's callbacks
            read the parameters they log from it there, and only there (W&B logs results
            without the config: ``log_config=False``, Ray's default); Tune calls its
            callbacks from the driver's one thread."""
            config = trial.config
            trial.config = redacted(config)
            try:
                super().log_trial_start(trial)
            finally:
                trial.config = config

    Redacting.__name__ = Redacting.__qualname__ = name
    Redacting.__module__ = __name__
    Redacting.__doc__ = f"Ray's ``{base_name}``, logging each trial's parameters redacted."
    return Redacting


def __getattr__(name: str) -> type:
    if name not in _BASES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = globals()[name] = _redacting(name)
    return cls


"""What a sweep records when it starts and ends, and the checks before ``--resume`` (or
``--confirm``) continues it: the sweep's identity (:data:`~components.search_space.SWEEP_RECORD`:
:func:`record_start`, :func:`check_resume`) and who could have written the Tune state a
resume unpickles (:func:`check_sweep_state`, :func:`record_sweep_state`, on
:mod:`components.sweep.state`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from components.runtime import console
from components.sweep.layout import SweepError, sweep_dir
from components.sweep.state import (
    DIGEST_FILE,
    TRUST_FLAG,
    UntrustedSweepState,
    check,
    is_remote,
    record,
)

if TYPE_CHECKING:
    from components.search_space import SweepConfig


def check_sweep_state(sweep: SweepConfig) -> None:
    """Before ``--resume`` unpickles Tune's state from the sweep dir: refuse files someone else
    could have written (a local dir: owners and modes; a URI: the record
    :func:`record_sweep_state` signed) — :mod:`components.sweep.state`.

    Raises:
        SweepError: naming the file, why, and what to do (``--trust-sweep-dir`` among it).
    """
    from components.io.storage import StorageError  # pyarrow

    try:
        check(sweep_dir(sweep))
    except (UntrustedSweepState, StorageError, OSError) as e:
        raise SweepError(str(e)) from None


def record_sweep_state(sweep: SweepConfig) -> None:
    """After a sweep run (finished or not): sign the sha256 of Tune's state files into a URI
    sweep dir (:func:`components.sweep.state.record`), which a later ``--resume`` checks. A
    local sweep dir needs none (its files' owners and modes are checked); a failure to write
    it is a warning, never the sweep's error."""
    from components.io.storage import StorageError, display  # pyarrow

    path = sweep_dir(sweep)
    try:
        if is_remote(path):
            record(path)
    except (StorageError, OSError) as e:
        console.say(f"[simgraph] warning: could not record {DIGEST_FILE} in {display(path)} "
                    f"({e}): a --resume will need {TRUST_FLAG}")


def record_start(sweep: SweepConfig, identity: dict[str, Any]) -> None:
    """Write :data:`~components.search_space.SWEEP_RECORD` into the new sweep dir."""
    from components.io import storage  # pyarrow
    from components.search_space import SWEEP_RECORD  # YAML + configs: ~0.1 s

    path = sweep_dir(sweep)
    storage.makedirs(path)
    storage.write_text(storage.join(path, SWEEP_RECORD),  # never a URI's credentials
                       json.dumps(storage.redacted(identity), indent=1))


def check_resume(sweep: SweepConfig, identity: dict[str, Any], flag: str = "--resume") -> None:
    """Refuse ``--resume`` when the sweep file, its base config or the command-line overrides
    changed since the sweep started: Tune would restore the old searcher's trials while new
    trials are built from the new files — two experiments in one sweep.

    Raises:
        SweepError: naming what changed and the two ways out.
    """
    from components.io import storage  # pyarrow
    from components.search_space import SWEEP_RECORD, identity_changes  # ~0.1 s

    path = storage.join(sweep_dir(sweep), SWEEP_RECORD)
    if not storage.exists(path):
        if storage.exists(sweep_dir(sweep)):
            console.say(f"[simgraph] warning: {storage.display(sweep_dir(sweep))} has no "
                        f"{SWEEP_RECORD} (the record of the files the sweep started from): "
                        "the files given now cannot be checked against them")
        return
    changed = identity_changes(storage.redacted(json.loads(storage.read_text(path))),
                               storage.redacted(identity))  # other credentials: the same
    if changed:
        what = ("resuming would mix two experiments" if flag == "--resume" else
                "confirming would retrain settings of another experiment")
        raise SweepError(
            f"{flag}: {'; '.join(changed)} changed since sweep {sweep.name!r} started; "
            f"{what}. Restore those files (and overrides), or start a new sweep with "
            "name=<another name>")

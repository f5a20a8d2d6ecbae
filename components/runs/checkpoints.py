"""A run dir's checkpoints: ``epoch_NNNNN/`` named by :func:`checkpoint_name` (inside each,
:mod:`components.runs.checkpoint`'s ``state.pt`` + ``meta.json`` holding a
:class:`~components.runs.checkpoint.TrainingState`), listed by :func:`checkpoints`, published
by :func:`publish_checkpoint` (whole or not at all), pruned by :func:`prune_checkpoints` (only
after the new one verified), the newest complete one found by :func:`latest_complete` (what
every resume starts from) and read by :func:`latest_state` / :func:`finished_history`. The
format of one checkpoint dir is :mod:`components.runs.checkpoint`'s; the run dir around them,
:mod:`components.runs.run_dir`'s."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # components.runs.checkpoint imports torch: imported where it is used
    from components.runs.checkpoint import TrainingState

CHECKPOINT_PREFIX = "epoch_"  # + the epochs completed, 5 digits: epoch_00012


def checkpoint_name(epoch: int) -> str:
    """The name of the checkpoint written after ``epoch`` epochs: ``epoch_00012``."""
    return f"{CHECKPOINT_PREFIX}{epoch:05d}"


def checkpoints(run_dir: str | Path) -> dict[int, str]:
    """{epochs completed: path} of every ``epoch_NNNNN`` entry of ``run_dir`` (a path or URI),
    complete or not (hidden temporaries of :func:`publish_checkpoint` are not listed)."""
    from components.io import storage

    n = len(CHECKPOINT_PREFIX)
    return {int(name[n:]): storage.join(str(run_dir), name)
            for name in storage.list_dir(str(run_dir))
            if name.startswith(CHECKPOINT_PREFIX) and name[n:].isdigit()}


def latest_complete(run_dir: str | Path) -> tuple[int, str] | None:
    """(epochs, dir) of the newest checkpoint ``epoch_NNNNN`` in ``run_dir`` (a path or URI)
    whose write completed and whose state is finite; dirs left by an interrupted write fail
    :func:`~components.runs.checkpoint.is_complete_at` and are skipped, as are checkpoints marked
    non-finite (:func:`~components.runs.checkpoint.is_finite_at`: never written by a run, which
    refuses a diverged state, but a resume must not start from one that got there).

    Raises:
        CheckpointUnreadable: a checkpoint could not be checked (a storage error): never
            taken for incomplete, so a resume never falls back to an older one or to scratch.
    """
    from components.runs.checkpoint import is_complete_at, is_finite_at

    found = checkpoints(run_dir)
    for epoch in sorted(found, reverse=True):
        if is_finite_at(found[epoch]) and is_complete_at(found[epoch]):
            return epoch, found[epoch]
    return None


def publish_checkpoint(local_dir: str | Path, run_dir: str, epoch: int) -> str:
    """Copy the checkpoint dir ``local_dir`` to ``run_dir``/:func:`checkpoint_name` (a path
    or URI) and verify it there; returns its path.

    Local: copied to a hidden sibling, flushed to disk, then renamed into place (a killed copy
    leaves no ``epoch_NNNNN`` dir, and its hidden copy is cleared by the next publish; a
    redone epoch replaces its old one). URI: uploaded file by
    file; an interrupted upload fails :func:`~components.runs.checkpoint.is_complete_at`
    (``meta.json``'s size check) and is never resumed from.

    Raises:
        CheckpointError: the copy did not verify (the older checkpoints are untouched).
        CheckpointWriteError: a local copy could not be written (a full disk): one line
            naming the file; the partial copy is removed, the older checkpoints untouched.
    """
    from components.io import storage
    from components.runs.checkpoint import (
        CheckpointError,
        CheckpointWriteError,
        is_complete_at,
        write_failure,
    )

    name = checkpoint_name(epoch)
    dest = storage.join(run_dir, name)
    if storage.is_uri(run_dir):
        storage.upload_dir(local_dir, dest)
    else:
        # A killed publish's copy (any pid: the run dir has one writer, rank 0) goes first.
        for stale in Path(run_dir).glob(f".{CHECKPOINT_PREFIX}*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(run_dir) / f".{name}.{os.getpid()}.tmp"
        try:
            # File by file (copytree would go on past a full disk and raise a list of errors)
            tmp.mkdir()
            for src in sorted(Path(local_dir).iterdir()):
                copy = shutil.copytree if src.is_dir() else shutil.copy2
                copy(src, tmp / src.name)
            for f in [*tmp.iterdir(), tmp]:  # on disk before the rename makes it the newest
                _fsync(f)
        except OSError as e:  # a full disk: the partial copy goes, the older ones stay
            shutil.rmtree(tmp, ignore_errors=True)
            failed = e.filename or tmp
            # name the file as it would have been published, not its hidden temporary
            shown = Path(dest) / Path(failed).relative_to(tmp) if Path(failed).is_relative_to(
                tmp) and Path(failed) != tmp else Path(dest)
            raise CheckpointWriteError(write_failure(shown, e)) from None
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
        _fsync(Path(run_dir))  # the rename itself
    if not is_complete_at(dest):
        raise CheckpointError(f"{storage.display(dest)} did not verify after it was written; "
                              "the older checkpoints are kept")
    return dest


def _fsync(path: Path) -> None:
    """Flush a file or a directory's entries to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prune_checkpoints(run_dir: str, keep: int | None) -> list[str]:
    """Delete all but the newest ``keep`` checkpoints of ``run_dir`` (``None``: keep all),
    never the newest complete finite one (:func:`latest_complete`: what a resume goes back
    to, even when newer non-finite ones count towards ``keep``); returns the deleted names.
    Call it only after :func:`publish_checkpoint` verified the newest (Ray Train prunes its
    own with ``CheckpointConfig(num_to_keep)``; a run reports it only finite checkpoints)."""
    from components.io import storage
    from components.runs.checkpoint import (
        STATE,
        CheckpointError,
        is_complete_at,
        is_finite_at,
        read_meta,
    )

    if keep is None:
        return []
    found = checkpoints(run_dir)
    epochs = sorted(found)
    gone = epochs[:-keep] if keep > 0 else epochs
    if gone:  # spare the newest finite complete one (its size checked, not its sha256:
        # publish_checkpoint has just verified the newest)
        for epoch in sorted(found, reverse=True):
            path = found[epoch]
            try:
                whole = (is_complete_at(path) if storage.is_uri(path) else
                         (Path(path) / STATE).stat().st_size == read_meta(path)["bytes"])
            except (CheckpointError, OSError, KeyError):
                whole = False
            if whole and is_finite_at(path):
                gone = [e for e in gone if e != epoch]
                break
    for epoch in gone:
        storage.delete_dir(found[epoch])
    return [checkpoint_name(e) for e in gone]


def latest_state(run_dir: str | Path) -> TrainingState | None:
    """The :class:`~components.runs.checkpoint.TrainingState` of the newest complete checkpoint
    (on the CPU), or ``None``."""
    from components.runs.checkpoint import TrainingState, local_copy

    done = latest_complete(run_dir)
    if done is None:
        return None
    with local_copy(done[1]) as d:
        return TrainingState.load(d)


def finished_history(run_dir: str | Path, epochs: int) -> list[dict[str, Any]] | None:
    """The per-epoch metrics history of a run whose newest complete checkpoint has trained at
    least ``epochs`` epochs (nothing left to train: ``simgraph pretrain`` prints it, a sweep
    trial replays it to Tune); ``None`` when there is training left."""
    done = latest_complete(run_dir)
    if done is None or done[0] < epochs:
        return None
    state = latest_state(run_dir)
    return None if state is None else state.history

"""The run dir, one owner for its format: ``<storage>/<name>/`` holds

* ``config.yaml`` — the run's whole config, written on the first start, without the
  credentials of any URI in it; a re-run must match it except :data:`RESUMABLE_CHANGES`
  (:func:`prepare_run_dir`, :func:`read_run_config`);
* ``dataset.json`` — the identity of the data it trains on; a re-run must find the same data
  (:func:`dataset_identity`, :func:`check_same_dataset`);
* ``epoch_NNNNN/`` checkpoints (:func:`checkpoint_name`; inside each,
  :mod:`components.runs.checkpoint`'s ``state.pt`` + ``meta.json`` holding a
  :class:`~components.runs.checkpoint.TrainingState`): listed by :func:`checkpoints`, published
  by :func:`publish_checkpoint` (whole or not at all), pruned by :func:`prune_checkpoints`
  (only after the new one verified), the newest complete one found by
  :func:`latest_complete` (what every resume starts from);
* ``metrics.csv`` and ``tb/`` (rank 0's per-epoch metrics), ``workers/rank<r>.json``, and the
  trackers' run ids (:data:`MLFLOW_RUN_ID`, :data:`WANDB_RUN_ID`: a resume continues the same
  tracker run).

A run is prepared through one function, :func:`prepare_run`: the driver-side checks before any
Ray work (:func:`check_dataset` → :class:`RunFacts`), the run dir created or checked, and
whether it has already finished. Whatever trains in a run dir — ``simgraph pretrain`` and
``simgraph run`` (``components.runs.recipe.run_pretraining``), each sweep trial and confirmation run
— calls it only through :func:`writing_run`, which holds the run dir's one-writer lock and
claims the folder around it for as long as the run trains. Read back by ``evaluate`` /
``export`` / ``embed`` through :func:`load_run`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from components.config import (
    TEMPERATURE_KEYS,
    ConfigError,
    PretrainConfig,
    flatten,
    from_dict,
    to_dict,
)
from components.config.loading import safe_load

# The trackers' files in a run dir are their owner's (components.training.tracking).
from components.data.identity import dataset_identity, identity_diff
from components.errors import SimgraphError

if TYPE_CHECKING:
    from components.runs.checkpoint import TrainingState

RUN_CONFIG = "config.yaml"
RUN_DATASET = "dataset.json"  # the dataset_identity a run started on (resumes must match)
METRICS_CSV = "metrics.csv"
CHECKPOINT_PREFIX = "epoch_"  # + the epochs completed, 5 digits: epoch_00012
# Keys that may differ when a run is resumed (longer training, other hardware, logging).
# Those that move the LR (LR_CHANGES: another number of workers is another global batch) are
# honoured by re-placing the restored schedule where a run started with the new values is
# after the same samples (PretrainRecipe._continue_schedule: elastic resume).
RESUMABLE_CHANGES = (
    "train.epochs", "train.log_every_steps", "scaling.", "checkpoint.keep",
    "knn.every_epochs", "data.num_workers", "data.os_cache", "data.jit", "data.stage",
    "storage", "tracking.",
    # What a diverged run is told to change before it resumes from its last good checkpoint.
    "optim.lr", "train.amp", "train.grad_clip",
)


# Resumable keys that move the learning rate: a resume re-places the restored schedule where a
# run started with the new values is after the same samples (components.runs.recipe, elastic
# resume) and says so, naming these.
LR_CHANGES = ("scaling.num_workers", "optim.lr", "train.epochs")


class RunError(SimgraphError, RuntimeError):
    """The run cannot start or did not finish; the message says why and what to do."""


def resume_changes(stored: dict[str, Any], cfg: PretrainConfig) -> list[tuple[str, Any, Any]]:
    """``(key, old, new)`` for each of :data:`LR_CHANGES` that differs between the config a
    checkpoint stores (a config dict, or a flat record of dotted keys: ``meta.json``'s
    ``shape``) and the one resuming it (``("scaling.num_workers", 1, 8)``)."""
    old = (dict(stored) if any("." in k for k in stored)  # a flat record (meta.json's shape)
           else flatten(_with_defaults(stored)))
    new = flatten(to_dict(cfg))
    return [(k, old[k], new[k]) for k in LR_CHANGES if k in old and old[k] != new[k]]


def _value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def describe_changes(changed: list[tuple[str, Any, Any]]) -> str:
    """``scaling.num_workers 1 -> 8, optim.lr 0.2 -> 0.1``."""
    return ", ".join(f"{k} {_value(a)} -> {_value(b)}" for k, a, b in changed)


def train_steps_per_epoch(cfg: PretrainConfig, train_samples: int) -> int:
    """Optimiser steps per epoch of ``cfg`` on ``train_samples`` training images: the
    training loader's length (:func:`components.data.reader.rank_order` with ``drop_last``
    keeps a multiple of ``scaling.num_workers × data.batch_size``; ``train.steps_per_epoch``
    caps it)."""
    steps = train_samples // (cfg.scaling.num_workers * cfg.data.batch_size)
    cap = cfg.train.steps_per_epoch
    return steps if cap is None else min(steps, cap)


def past_the_schedule(cfg: PretrainConfig, samples: int, changed: list[tuple[str, Any, Any]],
                      global_batch: int, total_steps: int) -> str:
    """Why a checkpoint that has seen ``samples`` cannot resume under ``cfg`` (a schedule of
    ``total_steps`` steps of ``global_batch``), and what to do instead."""
    per_epoch = max(1, total_steps // max(1, cfg.train.epochs)) * global_batch
    shape = [(k, a) for k, a, _ in changed if k == "scaling.num_workers"]
    ways = [f"resume it with {k}={_value(a)} (as it was)" for k, a in shape]
    ways += [f"raise train.epochs to at least {-(-samples // per_epoch)}",
             "start a new run (a new name=)"]
    return (f"run {cfg.name!r} cannot resume"
            + (f" with {describe_changes(changed)}" if changed else "")
            + f": its checkpoint has seen {samples} samples, past the end of this config's "
            f"schedule ({total_steps} steps of global batch {global_batch} = "
            f"{total_steps * global_batch} samples in train.epochs={cfg.train.epochs}), where "
            f"no step of a run started with it has an LR; {', or '.join(ways)}")


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What the driver learnt about the dataset that every worker needs (passed to them as a
    dict: :meth:`to_dict` / ``RunFacts(**d)``)."""

    num_classes: int
    caption_dim: int  # 0: the dataset stores no caption embeddings
    dataset: dict[str, Any]  # :func:`dataset_identity`, stored in every checkpoint
    knn: bool  # the online kNN monitor runs
    knn_note: str  # why it does not, when it does not
    needs_captions: bool  # the objective reads caption embeddings
    splits: dict[str, int] = dataclasses.field(default_factory=dict)  # samples per split
    warnings: list[str] = dataclasses.field(default_factory=list)  # legal but likely mistakes

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_dataset(cfg: PretrainConfig) -> RunFacts:
    """Check the dataset dir against the loss and batch; returns what the workers need.

    Raises:
        RunError: missing dataset, no labels for a supervised loss, no class graph or
            captions for X-CLR / CLIP, fewer training samples than one global batch.
    """
    from components.data.reader import DatasetError
    from components.data.staging import dataset_info
    from components.io import storage
    from components.io.storage import StorageError
    from components.objectives import build_objective

    try:
        info = dataset_info(cfg.data.dataset)  # a URI: only the manifest and class files
        train_n = info.splits.get("train", 0)
        info.split_file("train")
    except (DatasetError, StorageError) as e:
        raise RunError(str(e)) from None
    where = storage.display(cfg.data.dataset)
    sim = info.class_similarity()
    import torch

    try:  # the objective alone, on CPU: the checks the workers will hit, now (no model)
        objective = build_objective(
            cfg.loss, cfg.model.projector_dim, num_classes=len(info.classes),
            class_similarity=None if sim is None else torch.as_tensor(sim, dtype=torch.float32),
            caption_dim=info.caption_dim,
        )
    except ValueError as e:
        raise RunError(f"loss {cfg.loss.name!r} cannot train on {where}: {e}") from None
    needs = objective.requires
    if "labels" in needs and not info.classes:
        raise RunError(
            f"loss {cfg.loss.name!r} needs labels but {where} has none (no classes in its "
            "manifest); use simclr or xclr with graph=caption"
        )
    if "captions" in needs and info.caption_dim == 0:
        raise RunError(
            f"loss {cfg.loss.name!r} needs caption embeddings but {where} has no caption "
            "field; preprocess with captions.enabled=true"
        )
    want = getattr(cfg.loss, "caption_dim", None)
    if want is not None and info.caption_dim and want != info.caption_dim:
        raise RunError(
            f"loss.caption_dim={want} but {where} stores {info.caption_dim}-d caption "
            f"embeddings; set loss.caption_dim={info.caption_dim}"
        )
    global_batch = cfg.data.batch_size * cfg.scaling.num_workers
    if train_n < global_batch:
        raise RunError(
            f"{where} has {train_n} training samples, fewer than one global batch "
            f"({cfg.scaling.num_workers} workers × data.batch_size={cfg.data.batch_size}); "
            "lower data.batch_size"
        )
    knn = cfg.knn.every_epochs > 0
    knn_note = ""
    if knn and not info.classes:
        knn, knn_note = False, "no labels"
    elif knn and (info.splits.get(cfg.knn.query_split, 0) == 0
                  or info.splits.get(cfg.knn.bank_split, 0) == 0):
        knn, knn_note = False, (f"split {cfg.knn.query_split!r} or {cfg.knn.bank_split!r} is "
                                "empty")
    return RunFacts(num_classes=len(info.classes), caption_dim=info.caption_dim,
                    dataset=dataset_identity(info.manifest), knn=knn, knn_note=knn_note,
                    needs_captions="captions" in needs, splits=dict(info.splits),
                    warnings=config_warnings(cfg, train_n, knn_note))


# Outside these the papers report nothing: likely a typo or a units mistake, not refused.
TEMPERATURE_RANGE = (0.01, 1.0)  # SimCLR / SupCon τ 0.1, X-CLR τ_s 0.1, CoNe 0.07-0.1
LR_RANGE = {"adam": (1e-5, 1e-2), "adamw": (1e-5, 1e-2), "sgd": (1e-4, 10.0),
            "lars": (1e-4, 10.0)}


def config_warnings(cfg: PretrainConfig, train_n: int, knn_note: str = "") -> list[str]:
    """Settings that are allowed but probably not meant: a memory bank larger than the
    training set, the online kNN off because a split is empty, a temperature or LR far
    outside the papers' ranges. Printed before the run starts (and by ``simgraph validate``)."""
    out = []
    bank = int(getattr(cfg.loss, "bank_size", 0) or 0)
    if bank > train_n:
        out.append(f"loss.bank_size={bank} is larger than the {train_n} training samples: the "
                   f"bank would hold stale copies of the same samples; use at most {train_n}")
    if knn_note and cfg.knn.every_epochs > 0:
        out.append(f"the online kNN is off ({knn_note}): no knn_top1 in metrics.csv, and a sweep "
                   "on metric knn_top1 has nothing to rank; preprocess with split.val > 0")
    lo, hi = TEMPERATURE_RANGE
    for key in TEMPERATURE_KEYS:
        value = getattr(cfg.loss, key, None)
        if value is not None and not lo <= value <= hi:
            out.append(f"loss.{key}={value:g} lies outside [{lo:g}, {hi:g}], the range the "
                       "papers use (0.05-0.5 typical)")
    lr_lo, lr_hi = LR_RANGE.get(cfg.optim.name, (0.0, float("inf")))
    if not lr_lo <= cfg.optim.lr <= lr_hi:
        out.append(f"optim.lr={cfg.optim.lr:g} lies outside [{lr_lo:g}, {lr_hi:g}], the usual "
                   f"range for {cfg.optim.name}")
    return out


def absolute_paths(cfg: PretrainConfig, base: str | Path | None = None) -> PretrainConfig:
    """Local dataset and storage paths made absolute, relative ones against ``base`` (default:
    :func:`components.io.paths.base_dir`): Ray Train workers and Tune trials run in other working
    directories. URIs (``s3://`` …) are left as they are."""
    from components.io.paths import resolve_path

    return dataclasses.replace(
        cfg, storage=resolve_path(cfg.storage, base),
        data=dataclasses.replace(cfg.data, dataset=resolve_path(cfg.data.dataset, base)),
    )


def check_same_dataset(name: str, dataset: str, trained_on: dict[str, Any] | None,
                       now: dict[str, Any]) -> None:
    """Refuse to resume run ``name`` on a dataset other than the one it trained on.

    Raises:
        RunError: names what differs and the two ways out.
    """
    from components.io.storage import display

    if trained_on is None:
        return
    dataset = display(dataset)
    diff = identity_diff(trained_on, now)
    if diff:
        raise RunError(
            f"run {name!r} trained on other data than {dataset} holds now ({', '.join(diff)} "
            "differ: the dataset was rebuilt or replaced); resuming would continue it on "
            "different data. Restore the dataset it trained on, or start a new run (a new "
            "name=)")


def _with_defaults(d: dict[str, Any]) -> dict[str, Any]:
    """A stored config with the keys added since it was written filled in at their defaults
    (which keep the old behaviour), so an older run still resumes and evaluates; a config
    that no longer loads is compared as it is."""
    try:
        return to_dict(from_dict(PretrainConfig, d))
    except (ConfigError, TypeError):
        return d


def config_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two config dicts (either side may lack a key;
    keys added to the config classes later count as their defaults), ignoring
    :data:`RESUMABLE_CHANGES`: what makes two configs different runs. Values are compared
    without the credentials of their URIs (:func:`components.io.storage.redacted`: what is
    stored): the same place reached with other credentials is the same run."""
    from components.io.storage import redacted

    a, b = flatten(_with_defaults(redacted(old))), flatten(_with_defaults(redacted(new)))
    return sorted(k for k in set(a) | set(b)
                  if a.get(k) != b.get(k) and not k.startswith(RESUMABLE_CHANGES))


class CorruptRunConfig(RunError):
    """A run dir's ``config.yaml`` cannot be parsed (a partial copy, an edit gone wrong)."""


def read_run_config(run_dir: str) -> dict[str, Any] | None:
    """The run dir's ``config.yaml`` as a dict; ``None`` when there is none.

    Raises:
        CorruptRunConfig: the file is not UTF-8 YAML holding a mapping (the message names it).
        storage.StorageError: it cannot be read.
    """
    from components.io import storage

    path = storage.join(run_dir, RUN_CONFIG)
    if not storage.exists(path):
        return None
    try:
        data = safe_load(storage.read_text(path), storage.display(path))
    except (UnicodeDecodeError, yaml.YAMLError, ConfigError) as e:
        reason = str(e).splitlines()[0]
        raise CorruptRunConfig(f"{storage.display(path)} is corrupt ({reason})") from None
    if not isinstance(data, dict):
        raise CorruptRunConfig(f"{storage.display(path)} is corrupt (not a mapping of config "
                               "keys)")
    return data


def checkpoint_config(run_dir: str) -> tuple[str, dict[str, Any]] | None:
    """(checkpoint dir, the config stored in it) of the newest complete checkpoint, or None:
    what a run dir with a corrupt ``config.yaml`` still says about its run."""
    from components.runs.checkpoint import TrainingState, local_copy

    done = latest_complete(run_dir)
    if done is None:
        return None
    with local_copy(done[1]) as d:
        return done[1], TrainingState.load(d).config


def prepare_run_dir(cfg: PretrainConfig, dataset: dict[str, Any] | None = None) -> str:
    """Create ``storage/name`` (a path or URI) with ``config.yaml``, or check a re-run
    against it; returns the run dir. ``dataset``: the :func:`dataset_identity` the run is
    about to read (:attr:`RunFacts.dataset`): written to ``dataset.json`` on the first start,
    and a re-run must match it (a run dir from before ``dataset.json`` is checked against its
    newest complete checkpoint).

    Raises:
        RunError: the run dir holds another run's config (names the differing keys), the
            dataset changed since the run started (:func:`check_same_dataset`), or the
            storage cannot be written.
    """
    from components.io import storage

    run_dir = storage.join(cfg.storage, cfg.name)
    path = storage.join(run_dir, RUN_CONFIG)
    new = to_dict(cfg)
    try:
        storage.makedirs(run_dir)
        try:
            stored = read_run_config(run_dir)
        except CorruptRunConfig as e:  # the checkpoints still hold the run's config
            found = checkpoint_config(run_dir)
            stored = None if found is None else found[1]
            from components.runtime import console

            console.say(f"[simgraph] warning: {e}; " + (
                f"checked against {storage.display(found[0])}'s config instead and rewritten"
                if found is not None else "no checkpoint to lose: rewritten"))
        if stored is not None:
            diff = config_diff(stored, new)
            if diff:
                raise RunError(
                    f"run {cfg.name!r} in {storage.display(cfg.storage)} was started with a "
                    f"different config ({', '.join(diff[:6])} differ); re-running a name "
                    "resumes it, so choose a new name= or restore those values"
                )
        record = dataset is not None and _check_run_dataset(cfg, run_dir, dataset)
        # Never the credentials of a URI (storage, data.dataset, a tracker's URI): they are
        # used, not stored (a resume finds them in its own config or the environment).
        storage.write_text(path, yaml.safe_dump(storage.redacted(new), sort_keys=False))
        if record:
            storage.write_text(storage.join(run_dir, RUN_DATASET),
                               json.dumps(dataset, sort_keys=True))
    except storage.StorageError as e:
        raise RunError(f"cannot use storage {storage.display(cfg.storage)}: {e}") from None
    return run_dir


def _check_run_dataset(cfg: PretrainConfig, run_dir: str, dataset: dict[str, Any]) -> bool:
    """:func:`check_same_dataset` against what the run dir says it trained on; returns whether
    ``dataset.json`` is still to be written."""
    from components.io import storage

    path = storage.join(run_dir, RUN_DATASET)
    if storage.exists(path):
        trained_on = json.loads(storage.read_text(path))
    else:  # a fresh run, or one started before dataset.json: its newest checkpoint says
        trained_on = None
        done = latest_complete(run_dir)
        if done is not None:
            from components.runs.checkpoint import TrainingState, local_copy

            with local_copy(done[1]) as d:
                trained_on = TrainingState.load(d).dataset
    check_same_dataset(cfg.name, storage.display(cfg.data.dataset), trained_on, dataset)
    return not storage.exists(path)


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


@dataclasses.dataclass(frozen=True)
class PreparedRun:
    """A run ready to train: what :func:`prepare_run` checked and made.

    Attributes:
        cfg: the config, local paths absolute.
        facts: what the workers need to know about the dataset.
        run_dir: ``storage/name`` (a path or URI), created or checked.
        finished: the history when the run already trained ``train.epochs`` epochs (nothing
            to do), else ``None``.
    """

    cfg: PretrainConfig
    facts: RunFacts
    run_dir: str
    finished: list[dict[str, Any]] | None


def prepare_run(cfg: PretrainConfig, base: str | Path | None = None) -> PreparedRun:
    """Everything before training, for ``simgraph pretrain`` and each sweep trial alike —
    called through :func:`writing_run`, which holds the run dir's lock around it: local paths
    made absolute (against ``base``, default :func:`components.io.paths.base_dir`),
    the dataset checked against the loss (:func:`check_dataset`), a configured tracker's
    package present, the run dir created or checked against the config and data it started
    with (:func:`prepare_run_dir`), and whether it already finished.

    Raises:
        RunError: bad dataset, run dir, storage or tracker setup (before any Ray work).
    """
    cfg = absolute_paths(cfg, base)
    facts = check_dataset(cfg)
    if cfg.tracking.mlflow:
        from components.training.tracking import require_mlflow

        require_mlflow("tracking.mlflow=true")
    if cfg.tracking.wandb:
        from components.training.tracking import require_wandb

        require_wandb("tracking.wandb=true")
    run_dir = prepare_run_dir(cfg, facts.dataset)
    finished = finished_history(run_dir, cfg.train.epochs)
    if finished is None:
        check_resume(cfg, facts, run_dir)
    return PreparedRun(cfg, facts, run_dir, finished)


RUN_REFUSAL = ("another simgraph pretrain, run or sweep trial is training this run; wait for "
               "it, stop it, or choose another name=")


def _is_run_dir(_path: str, names: list[str]) -> bool:
    """Whether a non-empty folder's entries make it a run dir (``config.yaml``,
    ``dataset.json`` or a checkpoint, complete or being published)."""
    return bool({RUN_CONFIG, RUN_DATASET} & set(names)) or any(
        n.lstrip(".").startswith(CHECKPOINT_PREFIX) for n in names)


@contextlib.contextmanager
def writing_run(cfg: PretrainConfig, base: str | Path | None = None, *,
                command: str = "pretrain", wait_s: float = 0.0,
                waiting: str = "") -> Iterator[PreparedRun]:
    """:func:`prepare_run` holding the run dir's one-writer lock for the whole block: the one
    way into a run dir for whatever trains in it (``simgraph pretrain`` and ``simgraph run``
    through :func:`components.runs.recipe.run_pretraining`, each sweep trial and confirmation run).

    The lock (:func:`components.io.storage.writer_lock`: ``<storage>/.<name>.lock``, a file in
    this user's staging folder for a URI) is taken before ``config.yaml`` is read and released
    when the block ends — or by the kernel when this process dies — so a second writer can
    neither resume the same checkpoints, prune the first one's and take over its worker
    records, nor pass the config check beside it. Then a folder of someone else's files is
    refused (:func:`components.io.storage.claim_dir`): ``config.yaml``, checkpoints and worker
    records are never written among them. ``command`` names the caller in that refusal;
    ``wait_s`` > 0 waits that long for a held lock (a sweep trial whose previous process is
    still going), then gives up saying ``waiting``.

    Raises:
        RunError: another process holds the run dir (naming it), the folder holds files
            simgraph did not write, or what :func:`prepare_run` raises.
    """
    from components.io import storage

    run_dir = storage.join(absolute_paths(cfg, base).storage, cfg.name)
    with storage.writer_lock(run_dir, "the run dir", error=RunError, refusal=RUN_REFUSAL,
                             wait_s=wait_s, waiting=waiting):
        storage.claim_dir(run_dir, "run", _is_run_dir, error=RunError, command=command,
                          fix="choose another name= or storage=", mark=False)
        yield prepare_run(cfg, base)


def check_resume(cfg: PretrainConfig, facts: RunFacts, run_dir: str) -> None:
    """Before any Ray work: whether the run dir's newest complete checkpoint can resume under
    ``cfg`` — its samples seen (``meta.json``) within the schedule of ``cfg``'s shape (the
    recipe checks again from ``state.pt``, also for checkpoints older than the record).

    Raises:
        RunError: the samples seen are past the end of ``cfg``'s schedule
            (:func:`past_the_schedule`: what changed and what to do).
    """
    from components.runs.checkpoint import meta_at
    from components.training.optim import schedule_position

    done = latest_complete(run_dir)
    meta = {} if done is None else meta_at(done[1])
    samples, shape = meta.get("samples"), meta.get("shape")
    if not isinstance(samples, int) or not isinstance(shape, dict):
        return
    steps = train_steps_per_epoch(cfg, facts.splits.get("train", 0))
    global_batch = cfg.data.batch_size * cfg.scaling.num_workers
    total = steps * cfg.train.epochs
    if steps and schedule_position(samples, global_batch) > total:
        raise RunError(past_the_schedule(cfg, samples, resume_changes(shape, cfg),
                                         global_batch, total))


def load_run(run_dir: str | Path, checkpoint: str | Path | None = None, *,
             error: type[SimgraphError] = RunError, command: str = "evaluate"
             ) -> tuple[PretrainConfig, TrainingState, str]:
    """A finished (or interrupted) run as the commands that read one need it: its config, a
    verified checkpoint's :class:`~components.runs.checkpoint.TrainingState` (``checkpoint``, or
    the newest complete one) and that checkpoint's path. A corrupt ``config.yaml`` falls back
    to the checkpoint's config with a warning on stderr (``simgraph <command>: warning: ...``).
    Each reading command binds its error type and name once (``functools.partial``:
    ``components.runs.scoring.load_run``, ``components.export.embed.load_run``,
    ``pipelines.export.load_run``).

    Raises:
        ``error`` (the command's error type): not a run dir, no complete checkpoint, an
            unreadable checkpoint or one without a model, or a checkpoint written under
            another config than the run dir's.
    """
    import sys

    from components.io import storage
    from components.runs.checkpoint import CheckpointError, TrainingState, local_copy

    run_dir, checkpoint = str(run_dir), None if checkpoint is None else str(checkpoint)
    shown = storage.display(run_dir)
    try:
        raw = read_run_config(run_dir)
    except CorruptRunConfig as e:  # the checkpoints still hold the run's config
        stored = checkpoint_config(run_dir)
        if stored is None:
            raise error(f"{e}, and the run has no complete checkpoint to read its config "
                        "from") from None
        print(f"simgraph {command}: warning: {e}; using the config stored in "
              f"{storage.display(stored[0])}", file=sys.stderr)
        raw = stored[1]
    except storage.StorageError as e:
        raise error(f"cannot read {shown}: {e}") from None
    if raw is None:
        raise error(f"{shown} is not a run dir (no {RUN_CONFIG}); give the storage/name dir "
                    "that `simgraph pretrain` wrote")
    cfg = from_dict(PretrainConfig, raw)
    if checkpoint is None:
        found = latest_complete(run_dir)
        if found is None:
            raise error(f"{shown} has no complete checkpoint: pretrain it first (or let the "
                        "interrupted run resume)")
        checkpoint = found[1]
    try:
        with local_copy(checkpoint) as d:
            state = TrainingState.load(d)
    except (CheckpointError, storage.StorageError) as e:
        raise error(str(e)) from None
    diff = config_diff(state.config, dataclasses.asdict(cfg))
    if diff:
        raise error(
            f"checkpoint {storage.display(checkpoint)} was written by another config than "
            f"{shown} ({', '.join(diff[:5])} differ); {command} it with its own run dir")
    return cfg, state, str(checkpoint)


"""Full-state checkpoints (docs/design.md, "Checkpoints and resume").

A checkpoint is a directory holding ``state.pt`` (``torch.save`` of plain containers and
tensors) and ``meta.json``, written last, with the epoch, step and the sha256 of
``state.pt``. Both files go to a temp name first and are renamed, so a directory without
``meta.json``, or whose ``state.pt`` does not match it, is an interrupted write and is never
loaded (:func:`load_state` raises, :func:`is_complete` says no). Loading uses
``torch.load(weights_only=True)``: tensors and plain containers only, no code runs.

A training checkpoint's state is a :class:`TrainingState` (typed; :meth:`TrainingState.save`
/ :meth:`TrainingState.load`); :func:`save_state` / :func:`load_state` move any plain dict.
Only a finite state is a checkpoint: :meth:`TrainingState.save` refuses one whose tensors
(weights, BatchNorm statistics, memory bank, EMA encoder, optimizer state) hold NaN or inf
(:class:`NonFiniteState`; a diverged run must not replace its last good checkpoint), and
``meta.json`` records ``finite`` (:func:`save_state` checks any dict), so pruning and resuming
can pass over a non-finite one written by other means. A write that fails (a full disk)
removes what it wrote and raises :class:`CheckpointWriteError`, one line naming the file.
Where checkpoints live in a run dir (``epoch_NNNNN``, which is newest, publishing and
pruning) belongs to :mod:`components.runs.checkpoints`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from components.errors import SimgraphError
from components.io.files import replacing, sha256_file, write_json

if TYPE_CHECKING:
    from components.config import PretrainConfig
    from components.training.online_probe import OnlineProbe

FORMAT = "simgraph-checkpoint/1"
STATE, META = "state.pt", "meta.json"


class CheckpointError(SimgraphError, RuntimeError):
    """A checkpoint is incomplete, corrupted or from another format."""


class CheckpointUnreadable(CheckpointError):
    """A checkpoint could not be *checked* (an I/O or storage error, possibly transient): not
    evidence that it is incomplete, so never a reason to resume from an older one or from
    scratch."""


class NonFiniteState(CheckpointError):
    """A state to checkpoint holds NaN or inf (the run diverged): it is not written."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint file could not be written (a full disk, a quota, permissions); what was
    written of it has been removed. The message is one line naming the file."""


def write_failure(path: str | Path, e: OSError) -> str:
    """``cannot write PATH (reason); what to do`` for an ``OSError`` writing ``path``."""
    reason = e.strerror or str(e)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        todo = "free space on that disk (or raise the quota)"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        todo = "make it writable"
    else:
        todo = "check that disk"
    return f"cannot write {path} ({reason}); {todo}"


def nonfinite_entries(state: Mapping[str, Any], limit: int = 5) -> list[str]:
    """Where ``state`` (nested dicts / lists of tensors, as state dicts are) holds NaN or inf:
    the dotted names of the first ``limit`` floating-point tensors that do, then ``…`` if
    more do; empty when it is finite. One device read per device the tensors are on
    (a checkpoint's cost, never a training step's)."""
    found: list[tuple[str, torch.Tensor]] = []

    def walk(prefix: str, x: Any) -> None:
        if isinstance(x, torch.Tensor):
            if (x.is_floating_point() or x.is_complex()) and x.numel():
                found.append((prefix, x))
        elif isinstance(x, Mapping):
            for k, v in x.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(x, list | tuple):
            for i, v in enumerate(x):
                walk(f"{prefix}.{i}" if prefix else str(i), v)

    walk("", state)
    by_device: dict[torch.device, list[int]] = {}
    for i, (_, t) in enumerate(found):
        by_device.setdefault(t.device, []).append(i)
    bad: list[int] = []
    with torch.no_grad():
        for idx in by_device.values():
            finite = torch.stack([torch.isfinite(found[i][1]).all() for i in idx]).tolist()
            bad += [i for i, ok in zip(idx, finite, strict=True) if not ok]
    names = [found[i][0] for i in sorted(bad)]
    return names[:limit] + (["…"] if len(names) > limit else [])


# What meta.json records of a training state's config: what a resume on another shape needs
# to check before it starts training (components.runs.resume.check_resume), without state.pt.
SHAPE_KEYS = ("scaling.num_workers", "data.batch_size", "optim.lr", "train.epochs")


def _shape(config: Any) -> dict[str, Any]:
    """``{"shape": {key: value}}`` of :data:`SHAPE_KEYS` in a state's config dict."""
    if not isinstance(config, Mapping):
        return {}
    from components.config import flatten

    flat = flatten(config)
    return {"shape": {k: flat[k] for k in SHAPE_KEYS if k in flat}}


def save_state(directory: str | Path, state: dict[str, Any],
               finite: bool | None = None) -> Path:
    """Write ``state`` into ``directory`` (created) atomically; returns the directory.
    ``meta.json`` records whether every tensor in it is ``finite`` (checked here unless the
    caller already did: ``finite``).

    Raises:
        CheckpointWriteError: a file could not be written (a full disk): the message names
            it; nothing of this write is left in ``directory``.
    """
    d = Path(directory)
    if finite is None:
        finite = not nonfinite_entries(state, limit=1)
    current, created = d / STATE, not d.exists()
    try:
        d.mkdir(parents=True, exist_ok=True)
        with replacing(current) as tmp:  # a failed write removes its temporary
            torch.save(state, tmp)
        meta = {
            "format": FORMAT,
            "epoch": int(state.get("epoch", 0)),
            "step": int(state.get("step", 0)),
            **({} if state.get("samples") is None else {"samples": int(state["samples"])}),
            **_shape(state.get("config")),
            "sha256": sha256_file(current),
            "bytes": current.stat().st_size,
            "finite": bool(finite),
        }
        current = d / META
        write_json(current, meta)  # written last: its presence marks the checkpoint complete
    except OSError as e:
        for name in (META, STATE):  # a state.pt without its meta.json is no checkpoint
            with contextlib.suppress(OSError):
                (d / name).unlink(missing_ok=True)
        if created:
            with contextlib.suppress(OSError):
                d.rmdir()
        raise CheckpointWriteError(write_failure(current, e)) from None
    return d


@dataclasses.dataclass(kw_only=True)
class TrainingState:
    """A pretraining run's whole state after ``epoch`` epochs: what ``state.pt`` holds.

    Attributes:
        model: the ``PretrainModel``'s state dict (encoder, projector, classifier head,
            objective incl. its memory bank).
        optimizer, scheduler: their state dicts.
        epoch: epochs completed; step: optimiser steps done (skipped fp16 steps included).
        history: one metrics row per completed epoch.
        config: the run's config as a dict, without the credentials of any URI in it.
        seed: ``train.seed``.
        ema: the EMA encoder's state dict (losses with a momentum encoder), else ``None``.
        scaler: the fp16 ``GradScaler``'s state, else ``None``.
        dataset: the dataset identity the run trained on
            (:func:`components.data.identity.dataset_identity`); ``None`` in checkpoints older than
            it.
        samples: training samples consumed over all ranks (skipped fp16 steps included) —
            the schedule's position on any cluster shape (:func:`components.training.optim.
            schedule_position`); ``None`` in checkpoints older than it (then ``step`` ×
            ``data.batch_size`` × ``scaling.num_workers`` of ``config``:
            :meth:`samples_seen`).
        probe: the online linear probe's ``{"linear": state dict, "optimizer": state dict}``
            (``probe.every_epochs`` > 0), else ``None`` — also in checkpoints older than it (a
            resume with the probe on then starts it fresh).
    """

    model: dict[str, Any]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    epoch: int
    step: int
    history: list[dict[str, Any]]
    config: dict[str, Any]
    seed: int = 0
    ema: dict[str, Any] | None = None
    scaler: dict[str, Any] | None = None
    dataset: dict[str, Any] | None = None
    samples: int | None = None
    probe: dict[str, Any] | None = None

    _MAPPINGS = ("model", "optimizer", "scheduler", "config")

    def to_dict(self) -> dict[str, Any]:
        """The plain dict ``torch.save`` writes (no copies of the tensors)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "the checkpoint") -> TrainingState:
        """Check a loaded ``state.pt``; keys this version does not know are ignored.

        Raises:
            CheckpointError: a required key is missing or of the wrong type (names them).
        """
        names = {f.name for f in dataclasses.fields(cls)}
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING]
        missing = [k for k in required if k not in d]
        if missing:
            raise CheckpointError(f"{where} lacks {', '.join(missing)}: it is not a simgraph "
                                  "training checkpoint (or was written by a tool that "
                                  "dropped them)")
        wrong = [k for k in cls._MAPPINGS if not isinstance(d[k], dict)]
        wrong += [k for k in ("epoch", "step") if isinstance(d[k], bool)
                  or not isinstance(d[k], int)]
        wrong += [] if isinstance(d["history"], list) else ["history"]
        samples = d.get("samples")
        wrong += [] if samples is None or (isinstance(samples, int)
                                           and not isinstance(samples, bool)) else ["samples"]
        probe = d.get("probe")
        wrong += [] if probe is None or (isinstance(probe, dict) and {"linear", "optimizer"}
                                         <= probe.keys()) else ["probe"]
        if wrong:
            raise CheckpointError(f"{where} holds {', '.join(wrong)} of the wrong type: not a "
                                  "simgraph training checkpoint")
        return cls(**{k: v for k, v in d.items() if k in names})

    def samples_seen(self) -> int:
        """Training samples consumed before this checkpoint: :attr:`samples`, or for a
        checkpoint older than it, ``step`` × the global batch of the config it stores."""
        if self.samples is not None:
            return int(self.samples)
        data, scaling = self.config.get("data") or {}, self.config.get("scaling") or {}
        return int(self.step) * int(data.get("batch_size", 256)) * int(
            scaling.get("num_workers", 1))

    def nonfinite(self, limit: int = 5) -> list[str]:
        """Where the state to resume from (model incl. BatchNorm statistics and memory bank,
        EMA encoder, optimizer, scheduler, scaler, online probe) holds NaN / inf: names as
        :func:`nonfinite_entries` (``model.encoder…``, ``optimizer.state…``); empty when
        finite."""
        return nonfinite_entries({k: getattr(self, k) for k in
                                  ("model", "ema", "optimizer", "scheduler", "scaler", "probe")
                                  if getattr(self, k) is not None}, limit)

    def save(self, directory: str | Path, checked: bool = False) -> Path:
        """:func:`save_state` of this state; returns the directory. ``checked``: the caller
        has found :meth:`nonfinite` empty already.

        Raises:
            NonFiniteState: the state holds NaN / inf (names where): nothing is written.
            CheckpointWriteError: as :func:`save_state`.
        """
        if not checked:
            bad = self.nonfinite()
            if bad:
                raise NonFiniteState(f"the state after epoch {self.epoch} is not finite (NaN "
                                     f"or inf in {', '.join(bad)}): not saved to {directory}")
        return save_state(directory, self.to_dict(), finite=True)

    @classmethod
    def load(cls, directory: str | Path,
             map_location: str | torch.device = "cpu") -> TrainingState:
        """:func:`load_state` (verified) checked by :meth:`from_dict`.

        Raises:
            CheckpointError: incomplete, corrupted, or not a training checkpoint.
        """
        return cls.from_dict(load_state(directory, map_location), f"checkpoint {directory}")


def read_meta(directory: str | Path) -> dict[str, Any]:
    """``meta.json`` of a checkpoint dir.

    Raises:
        CheckpointError: missing (the write was interrupted) or not this format.
    """
    d = Path(directory)
    try:
        meta = json.loads((d / META).read_text())
    except FileNotFoundError:
        if not d.is_dir():  # a typo, or an epoch pruned by checkpoint.keep
            near = sorted(p.name for p in d.parent.glob("epoch_*")) if d.parent.is_dir() else []
            there = f"; {d.parent} has {', '.join(near[-5:])}" if near else ""
            raise CheckpointError(f"checkpoint {d} does not exist{there}") from None
        raise CheckpointError(
            f"{d} is not a complete checkpoint: no {META} (its write was interrupted)"
        ) from None
    except ValueError as e:
        raise CheckpointError(f"{d / META} is unreadable: {e}") from None
    except OSError as e:
        raise CheckpointUnreadable(f"cannot read {d / META}: {e}") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{d} has format {meta.get('format')!r}, expected {FORMAT!r}")
    return dict(meta)


def is_complete(directory: str | Path) -> bool:
    """Whether ``directory`` holds a checkpoint whose ``state.pt`` matches its ``meta.json``.

    Raises:
        CheckpointUnreadable: it could not be checked (an I/O error other than a missing
            file): the caller must not take it for incomplete.
    """
    try:
        meta = read_meta(directory)
    except CheckpointUnreadable:
        raise
    except CheckpointError:
        return False
    f = Path(directory) / STATE
    try:
        return bool(f.stat().st_size == meta.get("bytes")
                    and sha256_file(f) == meta.get("sha256"))
    except FileNotFoundError:
        return False
    except OSError as e:
        raise CheckpointUnreadable(f"cannot check {f}: {e}") from None


def load_state(directory: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Verify and load a checkpoint written by :func:`save_state`.

    Raises:
        CheckpointError: incomplete (interrupted write), checksum mismatch (corrupted), or
            not loadable with ``weights_only=True``.
    """
    d = Path(directory)
    meta = read_meta(d)
    f = d / STATE
    if not f.exists() or f.stat().st_size != meta["bytes"] or sha256_file(f) != meta["sha256"]:
        raise CheckpointError(
            f"{f} does not match its {META} (size or sha256): the checkpoint is corrupted or "
            "was partly overwritten; resume from an earlier one or start a new run"
        )
    try:
        state = torch.load(f, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises several types here
        raise CheckpointError(f"cannot load {f} with weights_only=True: {e}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{f} holds a {type(state).__name__}, not a state dict")
    return state


def meta_at(path: str | Path) -> dict[str, Any]:
    """``meta.json`` of the checkpoint at ``path`` (a dir or URI); ``{}`` when it cannot be
    read (what needs it falls back to ``state.pt``)."""
    from components.io import storage

    try:
        text = (storage.read_text(storage.join(str(path), META)) if storage.is_uri(str(path))
                else (Path(path) / META).read_text())
        meta = json.loads(text)
    except (OSError, ValueError, storage.StorageError):
        return {}
    return meta if isinstance(meta, dict) else {}


def is_finite_at(path: str | Path) -> bool:
    """Whether the checkpoint at ``path`` (a dir or URI) is not marked non-finite in its
    ``meta.json`` (one written before the mark counts as finite; an unreadable one is left to
    :func:`is_complete_at`)."""
    return meta_at(path).get("finite", True) is not False


def is_complete_at(path: str | Path) -> bool:
    """:func:`is_complete` for a local dir or a URI (``s3://…``). For a URI the check is
    ``meta.json`` readable and ``state.pt`` of the recorded size; the sha256 is verified when
    :func:`local_copy` + :func:`load_state` read it.

    Raises:
        CheckpointUnreadable: the storage could not be asked (see :func:`is_complete`).
    """
    from components.io import storage

    if not storage.is_uri(str(path)):
        return is_complete(path)
    try:
        meta = json.loads(storage.read_text(storage.join(str(path), META)))
        fs, fs_path = storage.resolve(storage.join(str(path), STATE))
        return bool(meta.get("format") == FORMAT and fs.get_file_info(fs_path).size
                    == meta["bytes"])
    except (storage.StorageNotFoundError, ValueError, KeyError):
        return False  # no meta.json, or not ours: an interrupted upload
    except (storage.StorageError, OSError) as e:
        raise CheckpointUnreadable(f"cannot check {storage.display(str(path))}: {e}") from None


@contextlib.contextmanager
def local_copy(path: str | Path) -> Iterator[Path]:
    """The checkpoint dir ``path`` on local disk: itself, or a temporary download of a URI."""
    from components.io import storage

    if not storage.is_uri(str(path)):
        yield Path(path)
        return
    with tempfile.TemporaryDirectory(prefix="simgraph-ckpt-") as tmp:
        storage.download_dir(str(path), tmp)
        yield Path(tmp)


def checkpoint_state(cfg: PretrainConfig, *, model: Any, ema: Any, optimizer: Any,
                     scheduler: Any, scaler: Any, epoch: int, step: int,
                     history: list[dict[str, Any]], dataset: dict[str, Any],
                     samples: int | None = None, probe: OnlineProbe | None = None
                     ) -> TrainingState:
    """What a checkpoint holds: the full training state after ``epoch`` epochs (``samples``:
    the training samples consumed, all ranks; ``probe``: the online linear probe's weights
    and optimizer state, when it runs), the history, the dataset identity and the
    run's config — without the credentials of any URI in it
    (:func:`components.io.storage.redacted`), as in ``config.yaml``."""
    from components.config import to_dict
    from components.io.storage import redacted

    return TrainingState(
        model=model.state_dict(), ema=None if ema is None else ema.state_dict(),
        optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
        scaler=None if scaler is None else scaler.state_dict(),
        epoch=epoch, step=step, history=history, seed=cfg.train.seed,
        config=redacted(to_dict(cfg)), dataset=dataset, samples=samples,
        probe=None if probe is None else probe.state_dict(),
    )

"""Full-state checkpoints (DESIGN.md "Checkpoints and resume").

A checkpoint is a directory holding ``state.pt`` (``torch.save`` of plain containers and
tensors) and ``meta.json``, written last, with the epoch, step and the sha256 of
``state.pt``. Both files go to a temp name first and are renamed, so a directory without
``meta.json``, or whose ``state.pt`` does not match it, is an interrupted write and is never
loaded (:func:`load_state` raises, :func:`is_complete` says no). Loading uses
``torch.load(weights_only=True)``: tensors and plain containers only, no code runs.

State keys (``pipelines/pretrain.py``): ``model`` (encoder, projector, classifier head,
objective incl. memory bank), ``ema``, ``optimizer``, ``scheduler``, ``scaler``, ``epoch``
(epochs completed), ``step`` (optimizer steps done), ``history`` (per-epoch metrics),
``seed`` and ``config``.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from components.errors import SimgraphError
from components.files import replacing, sha256_file, write_json

FORMAT = "simgraph-checkpoint/1"
STATE, META = "state.pt", "meta.json"


class CheckpointError(SimgraphError, RuntimeError):
    """A checkpoint is incomplete, corrupted or from another format."""


class CheckpointUnreadable(CheckpointError):
    """A checkpoint could not be *checked* (an I/O or storage error, possibly transient): not
    evidence that it is incomplete, so never a reason to resume from an older one or from
    scratch."""


def save_state(directory: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` into ``directory`` (created) atomically; returns the directory."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    with replacing(d / STATE) as tmp:
        torch.save(state, tmp)
    meta = {
        "format": FORMAT,
        "epoch": int(state.get("epoch", 0)),
        "step": int(state.get("step", 0)),
        "sha256": sha256_file(d / STATE),
        "bytes": (d / STATE).stat().st_size,
    }
    write_json(d / META, meta)  # written last: its presence marks the checkpoint complete
    return d


def read_meta(directory: str | Path) -> dict[str, Any]:
    """``meta.json`` of a checkpoint dir.

    Raises:
        CheckpointError: missing (the write was interrupted) or not this format.
    """
    d = Path(directory)
    try:
        meta = json.loads((d / META).read_text())
    except FileNotFoundError:
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


def is_complete_at(path: str | Path) -> bool:
    """:func:`is_complete` for a local dir or a URI (``s3://…``). For a URI the check is
    ``meta.json`` readable and ``state.pt`` of the recorded size; the sha256 is verified when
    :func:`local_copy` + :func:`load_state` read it.

    Raises:
        CheckpointUnreadable: the storage could not be asked (see :func:`is_complete`).
    """
    from components import storage

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
    from components import storage

    if not storage.is_uri(str(path)):
        yield Path(path)
        return
    with tempfile.TemporaryDirectory(prefix="simgraph-ckpt-") as tmp:
        storage.download_dir(str(path), tmp)
        yield Path(tmp)

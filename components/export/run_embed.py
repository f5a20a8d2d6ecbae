"""A run's embeddings of images (``simgraph embed``): :func:`embed_run`, top to bottom:

1. Tell what ``--data`` is: a dataset dir (it has a ``manifest.json``; a path or URI) or a
   folder of images (class sub-folders and / or images at its root). Anything else, ``--split``
   with a folder, or a split the dataset does not have is a one-line error before any loading.
2. Load the run's ``config.yaml`` and a checkpoint (the newest complete one, or
   ``--checkpoint``), refusing a checkpoint written under another config, as ``simgraph
   evaluate`` and ``export`` do; rebuild its backbone and projector.
3. Embed one centre view per image, exactly as evaluation sees it (``components/export/embed.py``):
   a dataset dir's split(s) through the evaluation reader (default: every split with samples);
   a folder's images decoded as preprocessing decodes them — shrunk to the ``max_side`` the
   run's dataset was built with, when its manifest is readable — then the reader's crop,
   resize and normalisation. Backbone features, or the projector's output with
   ``--projector``; batched, on ``--device`` (default: ``cuda:0`` when torch sees a GPU, else
   the CPU), a progress bar on a terminal.
4. Write ``--out`` whole or not at all: ``sample_id``, ``split`` (dataset) or ``path``
   (folder), ``label``, ``class``, ``caption`` (null where not known), ``embedding``
   (``fixed_size_list<float32>``); the schema metadata ``simgraph`` says which run,
   checkpoint, feature and input view made them.

This module owns the command's engine: what ``--data`` is, the run's ``max_side``, and the
metadata written with the file; the embedding itself and the file format are
:mod:`components.export.embed`'s.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from components.data.devices import resolve_device
from components.data.reader import DatasetInfo
from components.data.shards import MANIFEST
from components.data.staging import local_dataset
from components.export.embed import (
    EmbedArgumentError,
    EmbedError,
    dataset_splits,
    describe_input,
    embed_dataset,
    embed_folder,
    list_images,
    to_table,
    write_parquet,
)
from components.io import storage
from components.runs.run_dir import load_run


def data_kind(data: str) -> str:
    """``dataset`` (``data`` holds a ``manifest.json``) or ``folder`` (a local directory);
    the folder's images are checked when it is listed.

    Raises:
        EmbedError: neither.
    """
    try:
        if storage.exists(storage.join(data, MANIFEST)):
            return "dataset"
    except storage.StorageError as e:
        raise EmbedError(f"cannot read --data {storage.display(data)}: {e}") from None
    if not storage.is_uri(data) and Path(data).is_dir():
        return "folder"
    raise EmbedError(f"--data {storage.display(data)} is neither a dataset dir (no {MANIFEST}) "
                     "nor a folder of images")


def trained_max_side(dataset: str) -> int | None:
    """The ``image.max_side`` the run's dataset was built with (its manifest's
    ``fields.image.max_side``), or None when that manifest cannot be read from here."""
    try:
        manifest = json.loads(storage.read_text(storage.join(dataset, MANIFEST)))
        side = manifest["fields"]["image"]["max_side"]
    except (storage.StorageError, OSError, ValueError, KeyError, TypeError):
        return None
    return int(side) if isinstance(side, int) and side > 0 else None


def embed_run(run_dir: str, data: str, out: str, *, split: str | None = None,
              projector: bool = False, checkpoint: str | None = None,
              device: str | None = None) -> dict[str, Any]:
    """Embed ``data`` with the run's encoder into ``out`` (see the module docstring); returns
    the file's metadata (with ``seconds``: the embedding's wall time). ``device``: ``cpu`` /
    ``cuda`` / ``cuda:N``; ``None``: from this process's resources
    (:func:`~components.data.devices.resolve_device`).

    Raises:
        EmbedError / EmbedArgumentError / DatasetError: see the module docstring.
        ReaderSettingError: a bad ``device`` (before anything loads).
    """
    dev = resolve_device(device)
    kind = data_kind(data)
    shown = storage.display(data)
    if not storage.is_uri(out) and Path(out).is_dir():
        raise EmbedArgumentError(f"--out {out} is a directory; give a file name, e.g. "
                                 f"{Path(out) / 'embeddings.parquet'}")
    if kind == "folder":
        if split is not None:
            raise EmbedArgumentError(f"--split {split!r} applies to a dataset dir; --data "
                                     f"{data} is a folder of images")
        list_images(data)  # no images: fail before loading the checkpoint
    else:
        data = str(local_dataset(data, stage=False))  # a URI: a verified local copy
        dataset_splits(DatasetInfo.load(data), split)  # an unknown split: before loading
    run = load_run(run_dir, checkpoint, error=EmbedError, command="embed")
    cfg, state, ckpt = run.config, run.state, run.checkpoint
    encoder = run.encoder()
    meta: dict[str, Any] = {
        "run": storage.basename(run_dir), "run_dir": storage.display(run_dir),
        "checkpoint": storage.display(ckpt), "epoch": state.epoch,
        "feature": "projector" if projector else "backbone",
        "input": describe_input(cfg.data.augment),
        "data": {"kind": kind, "path": shown},
    }
    started = time.perf_counter()
    if kind == "dataset":
        e = embed_dataset(encoder, data, cfg.data.augment, split=split, projector=projector,
                          batch_size=cfg.data.batch_size, num_workers=cfg.data.num_workers,
                          device=dev, jit=cfg.data.jit)
        meta["data"]["splits"] = sorted(set(e.splits or []), key=(e.splits or []).index)
    else:
        side = trained_max_side(cfg.data.dataset)
        if side is None:
            print("simgraph embed: note: the run's dataset manifest is not readable here, so "
                  "its image.max_side is unknown: images are cropped and resized from their "
                  "full size (the build would have shrunk larger ones first)", file=sys.stderr)
        trained_on = state.dataset or {}  # its identity: classes numbered as it numbers them
        e = embed_folder(encoder, data, cfg.data.augment, projector=projector, max_side=side,
                         batch_size=cfg.data.batch_size, num_workers=cfg.data.num_workers,
                         device=dev, classes_of_run=trained_on.get("classes"))
        meta["data"]["max_side"] = side
        meta["data"]["skipped"] = len(e.skipped)
        if e.skipped:
            few = "; ".join(f"{p} ({r})" for p, r in e.skipped[:5])
            more = f" and {len(e.skipped) - 5} more" if len(e.skipped) > 5 else ""
            print(f"simgraph embed: skipped {len(e.skipped)} files that are not readable "
                  f"images: {few}{more}", file=sys.stderr)
    seconds = time.perf_counter() - started
    write_parquet(to_table(e, meta), out)
    return {**meta, "rows": len(e), "dim": e.dim, "seconds": seconds}

"""A run dir's export (``simgraph export``): :func:`export_run`, top to bottom:

1. Load the run's ``config.yaml`` and a checkpoint (the newest complete one, or
   ``--checkpoint``), refusing a checkpoint written under another config (as ``simgraph
   evaluate`` does). The dataset is not needed.
2. Rebuild the backbone and projector from the checkpoint and write them in the format asked
   for (``components/export/formats.py``: plain-torch state dicts — torchvision's own keys for a
   ResNet — or TorchScript, or ONNX with a dynamic batch axis), checked against the encoder.
3. Describe them in ``config.json`` and ``model_card.md``: architecture, input (resolution,
   RGB, NCHW float32, the evaluation reader's normalisation), loss and its parameters, dataset
   identity and classes (from the dataset's manifest when it is reachable and still the one
   the run trained on, else from the checkpoint's record of it), ``<run>/eval/metrics.json``
   when the run was evaluated (with its intervals), the recipe in one line (loss, backbone,
   epochs, batch, optimiser), simgraph's version and git commit.

Everything goes to ``--out`` (default ``<run>/export/``; a path or URI): a new or empty folder,
or one an earlier export wrote; a folder holding other files is refused naming them, and of
an earlier export only the files its ``config.json`` records (unchanged since) are replaced or
removed (:func:`components.export.export_dir.claim_export_dir`).

This module owns what a run's export adds to ``config.json`` (``run``, ``loss``, ``recipe``,
``dataset``, ``metrics``, ``provenance``); the card's sections for them are
:func:`components.export.card.card_sections`.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from components.config import PretrainConfig, to_dict
from components.config.backbones import is_timm
from components.data.identity import dataset_identity
from components.data.shards import MANIFEST
from components.export.card import card_sections
from components.export.export_dir import claim_export_dir, export_encoder
from components.export.formats import ExportError, check_format
from components.io import storage
from components.io.paths import project_root
from components.runs.run_dir import load_run

if TYPE_CHECKING:
    from components.runs.checkpoint import TrainingState

EVAL_METRICS = ("eval", "metrics.json")  # what `simgraph evaluate` writes into a run dir


def _manifest(dataset: str) -> dict[str, Any] | None:
    """The dataset dir's manifest, or None when it cannot be read from here."""
    try:
        data = json.loads(storage.read_text(storage.join(dataset, MANIFEST)))
    except (storage.StorageError, OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def dataset_section(cfg: PretrainConfig, state: TrainingState) -> dict[str, Any]:
    """``config.json``'s ``dataset``: where, its identity (the checkpoint's ``dataset``) and,
    when known, the classes in label order and how the images were stored."""
    identity = state.dataset
    out: dict[str, Any] = {"path": storage.display(cfg.data.dataset), "identity": identity}
    manifest = _manifest(cfg.data.dataset)
    if manifest is not None and (identity is None or dataset_identity(manifest) == identity):
        classes = manifest.get("classes") or []
        out["classes_from"] = "manifest"
        image = (manifest.get("fields") or {}).get("image")
        if image:
            out["stored_images"] = image
    else:
        classes = (identity or {}).get("classes") or []
        out["classes_from"] = "checkpoint"
        out["manifest"] = ("not reachable" if manifest is None
                           else "differs from the data the run trained on")
    if classes:
        out["classes"] = list(classes)  # label i is classes[i]
    else:
        out.pop("classes_from")
    return out


def metrics_section(run_dir: str) -> dict[str, Any] | None:
    """``<run>/eval/metrics.json`` (``simgraph evaluate``'s), or None when there is none."""
    path = storage.join(run_dir, *EVAL_METRICS)
    try:
        if not storage.exists(path):
            return None
        data = json.loads(storage.read_text(path))
    except (storage.StorageError, OSError, ValueError) as e:
        print(f"simgraph export: warning: {storage.display(path)} is unreadable ({e}); "
              "exported without metrics", file=sys.stderr)
        return None
    if not isinstance(data, dict):
        return None
    return {"file": "/".join(EVAL_METRICS), **data}


def git_commit() -> str:
    """``git rev-parse HEAD`` of the simgraph source tree, or ``unknown``."""
    try:
        done = subprocess.run(["git", "-C", str(project_root()), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else "unknown"


def provenance(backbone: str | None = None) -> dict[str, Any]:
    """``config.json``'s ``provenance``: simgraph's version and git commit, torch's and
    torchvision's versions (and timm's for a timm ``backbone``: its module names are the
    weights' keys), when."""
    # torch and torchvision only for their versions (a ConvNet's export never imports
    # torchvision otherwise)
    import torch
    import torchvision

    try:
        version = importlib.metadata.version("simgraph")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    out = {"simgraph": version, "git_commit": git_commit(), "torch": torch.__version__,
           "torchvision": torchvision.__version__}
    if backbone is not None and is_timm(backbone):
        import timm

        out["timm"] = timm.__version__
    out["exported_at"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return out


def init_section(cfg: Any, run_dir: str) -> dict[str, Any] | None:
    """``config.json``'s ``init``: where the run's starting weights came from —
    ``model.init``'s file name, path and sha256 (the run dir's ``init.json``,
    :mod:`components.runs.init_checks`); None for a random init."""
    if not cfg.model.init:
        return None
    from components.runs.init_checks import read_run_init

    record = read_run_init(run_dir) or {}
    return {"file": storage.basename(cfg.model.init), "path": cfg.model.init,
            "sha256": record.get("sha256")}


def recipe_section(cfg: PretrainConfig) -> dict[str, Any]:
    """``config.json``'s ``recipe``: what trained the weights in one line (``summary``, which
    the card and a timm export's ``pretrained_cfg.description`` quote) and its numbers: the
    loss and its parameters, the backbone, epochs, the global batch (per worker × workers),
    the optimiser and its base learning rate, the crops' resolution; a config that names its
    recipe (``recipe.name`` / ``recipe.paper``, pipelines/configs/recipes/) leads with it."""
    loss = to_dict(cfg.loss)
    name = loss.pop("name")
    params = ", ".join(f"{k}={v}" for k, v in loss.items())
    workers = cfg.scaling.num_workers
    batch = cfg.data.batch_size * workers
    r = cfg.data.augment.resolution
    summary = (f"{name} ({params}) on {cfg.model.backbone}, {cfg.train.epochs} epochs, "
               f"batch {batch} ({cfg.data.batch_size} × {workers} worker"
               f"{'s' if workers != 1 else ''}), {cfg.optim.name} lr {cfg.optim.lr}, {r} px")
    named = {k: v for k, v in (("name", cfg.recipe.name), ("paper", cfg.recipe.paper)) if v}
    if named:
        summary = f"{' — '.join(named.values())}: {summary}"
    return {"summary": summary, **{f"recipe_{k}": v for k, v in named.items()},
            "loss": name, "backbone": cfg.model.backbone,
            "epochs": cfg.train.epochs, "batch_size": batch,
            "batch_size_per_worker": cfg.data.batch_size, "workers": workers,
            "optimizer": cfg.optim.name, "lr": cfg.optim.lr, "resolution": r}


def export_run(run_dir: str, checkpoint: str | None = None, fmt: str = "safetensors",
               projector: bool = False, out: str | None = None) -> str:
    """Export one run (see the module docstring); returns the output dir (path or URI).

    Raises:
        UnknownFormat: ``fmt`` is not an export format.
        ExportError: not a run dir, no complete checkpoint, a checkpoint of another config.
    """
    check_format(fmt)
    run = load_run(run_dir, checkpoint, error=ExportError, command="export")
    cfg, state, ckpt = run.config, run.state, run.checkpoint
    encoder = run.encoder()
    name = storage.basename(run_dir)
    loss = to_dict(cfg.loss)
    loss = {"name": loss.pop("name"), **loss}
    describe = {
        "run": {"name": name, "dir": storage.display(run_dir),
                "checkpoint": storage.display(ckpt), "epoch": state.epoch,
                "step": state.step, "epochs": cfg.train.epochs},
        "init": init_section(cfg, run_dir),
        "loss": loss,
        "recipe": recipe_section(cfg),
        "dataset": dataset_section(cfg, state),
        "provenance": provenance(cfg.model.backbone),
    }
    metrics = metrics_section(run_dir)
    if metrics is not None:
        describe["metrics"] = metrics
    dest = out or storage.join(run_dir, "export")
    # Before anything is written: a folder of someone else's files is refused, and only the
    # files an earlier export wrote there may be replaced or removed (export_dir.py).
    replaceable = claim_export_dir(dest)
    with storage.LocalMirror(dest) as mirror:
        export_encoder(encoder, cfg.model, cfg.data.augment, mirror.local, fmt=fmt,
                       with_projector=projector, run=name, describe=describe,
                       card_extra=card_sections, replaceable=replaceable)
    storage.release_dir(dest)  # its config.json says it is an export from now on
    return dest

"""``simgraph export RUN_DIR [--checkpoint DIR] [--format safetensors|torchscript|onnx]
[--projector] [--out DIR]``: a trained encoder as files that load without simgraph.

Top to bottom:

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
   when the run was evaluated (with its intervals), simgraph's version and git commit.

Everything goes to ``--out`` (default ``<run>/export/``; a path or URI): a new or empty folder,
or one an earlier export wrote; a folder holding other files is refused naming them, and of
an earlier export only the files its ``config.json`` records (unchanged since) are replaced or
removed (:func:`components.export.formats.claim_export_dir`).
"""

from __future__ import annotations

import datetime
import functools
import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from components.config import PretrainConfig, to_dict
from components.errors import run_command
from components.export.formats import CARD, CONFIG, ExportError, check_format
from components.runs.run_dir import load_run as run_dir_load_run

if TYPE_CHECKING:
    from components.runs.checkpoint import TrainingState

EVAL_METRICS = ("eval", "metrics.json")  # what `simgraph evaluate` writes into a run dir


# The run's config, a verified checkpoint state and its path (ExportError when it cannot).
load_run = functools.partial(run_dir_load_run, error=ExportError, command="export")


def _manifest(dataset: str) -> dict[str, Any] | None:
    """The dataset dir's manifest, or None when it cannot be read from here."""
    from components.data.shards import MANIFEST
    from components.io import storage

    try:
        data = json.loads(storage.read_text(storage.join(dataset, MANIFEST)))
    except (storage.StorageError, OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def dataset_section(cfg: PretrainConfig, state: TrainingState) -> dict[str, Any]:
    """``config.json``'s ``dataset``: where, its identity (the checkpoint's ``dataset``) and,
    when known, the classes in label order and how the images were stored."""
    from components.data.identity import dataset_identity
    from components.io import storage

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
    from components.io import storage

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
    from components.io.paths import project_root

    try:
        done = subprocess.run(["git", "-C", str(project_root()), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else "unknown"


def provenance() -> dict[str, Any]:
    import importlib.metadata

    import torch
    import torchvision

    try:
        version = importlib.metadata.version("simgraph")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {"simgraph": version, "git_commit": git_commit(), "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "exported_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def _pct(x: Any) -> str:
    return "—" if not isinstance(x, (int, float)) else f"{100 * x:.1f} %"


def _interval(iv: dict[str, Any] | None, scale: float = 100.0, digits: int = 1) -> str:
    if not iv or not all(isinstance(iv.get(k), (int, float)) for k in ("low", "high")):
        return ""
    return f" [{scale * iv['low']:.{digits}f}, {scale * iv['high']:.{digits}f}]"


def card_sections(config: dict[str, Any]) -> str:
    """``model_card.md``'s training, metrics and provenance sections."""
    loss, run, ds, prov = config["loss"], config["run"], config["dataset"], config["provenance"]
    params = ", ".join(f"{k}={v}" for k, v in loss.items() if k != "name")
    classes = ds.get("classes")
    cls = (f"{len(classes)} classes (label i is `dataset.classes[i]` in `{CONFIG}`): "
           + ", ".join(classes[:20]) + (", …" if len(classes) > 20 else "")
           if classes else "classes: not known here")
    lines = [
        "", "## Training", "",
        f"Loss **{loss['name']}** ({params}); run `{run['name']}`, checkpoint after epoch "
        f"{run['epoch']} of {run['epochs']} (step {run['step']}): `{run['checkpoint']}`.", "",
        f"Dataset `{ds['path']}`; {cls}.",
    ]
    m = config.get("metrics")
    lines += ["", "## Metrics", ""]
    if m is None:
        lines.append("Not evaluated: run `simgraph evaluate` on the run dir, then export again "
                     "to include its metrics.")
    else:
        iv = m.get("intervals") or {}
        knn = m.get("knn") or {}
        rows = ["| metric | value | 95 % interval |", "|---|---:|---|"]
        for k in sorted(knn, key=lambda s: int(s) if str(s).isdigit() else 0):
            rows.append(f"| weighted kNN@{k} top-1 | {_pct(knn[k].get('top1'))} | "
                        f"{_interval(iv.get(f'knn@{k}')).strip() or '—'} |")
        probe = (m.get("probe") or {}).get("top1")
        rows.append(f"| linear probe top-1 | {_pct(probe)} | "
                    f"{_interval(iv.get('probe')).strip() or '—'} |")
        margin = (m.get("separation") or {}).get("margin")
        if isinstance(margin, (int, float)):
            rows.append(f"| SINCERE margin | {margin:.3f} | "
                        f"{_interval(iv.get('margin'), 1.0, 3).strip() or '—'} |")
        when = m.get("epoch")
        note = (f"\n\n**These metrics are of the checkpoint after epoch {when}, not of the "
                f"exported one (epoch {run['epoch']}).**" if when != run["epoch"] else "")
        lines += [
            f"From `{m['file']}` (`simgraph evaluate`): {m.get('feature', 'backbone')} features, "
            f"labels: {m.get('labels', 'dataset classes')}; "
            f"{m.get('interval_method', 'no intervals')}.", "", *rows, note,
        ]
    lines += [
        "", "## Provenance", "",
        f"simgraph {prov['simgraph']} (git commit `{prov['git_commit']}`), torch "
        f"{prov['torch']}, torchvision {prov['torchvision']}; exported {prov['exported_at']}.",
        f"Dataset identity (manifest digest and split checksums) in `{CONFIG}` "
        "→ `dataset.identity`.", "",
    ]
    return "\n".join(lines)


def export_run(run_dir: str, checkpoint: str | None = None, fmt: str = "safetensors",
               projector: bool = False, out: str | None = None) -> str:
    """Export one run (see the module docstring); returns the output dir (path or URI).

    Raises:
        UnknownFormat: ``fmt`` is not an export format.
        ExportError: not a run dir, no complete checkpoint, a checkpoint of another config.
    """
    from components.export.formats import claim_export_dir, encoder_from_state, export_encoder
    from components.io import storage

    check_format(fmt)
    cfg, state, ckpt = load_run(run_dir, checkpoint)
    encoder = encoder_from_state(cfg.model, state.model)
    name = storage.basename(run_dir)
    loss = to_dict(cfg.loss)
    loss = {"name": loss.pop("name"), **loss}
    describe = {
        "run": {"name": name, "dir": storage.display(run_dir),
                "checkpoint": storage.display(ckpt), "epoch": state.epoch,
                "step": state.step, "epochs": cfg.train.epochs},
        "loss": loss,
        "dataset": dataset_section(cfg, state),
        "provenance": provenance(),
    }
    metrics = metrics_section(run_dir)
    if metrics is not None:
        describe["metrics"] = metrics
    dest = out or storage.join(run_dir, "export")
    # Before anything is written: a folder of someone else's files is refused, and only the
    # files an earlier export wrote there may be replaced or removed (components/export/formats.py).
    replaceable = claim_export_dir(dest)
    with storage.LocalMirror(dest) as mirror:
        export_encoder(encoder, cfg.model, cfg.data.augment, mirror.local, fmt=fmt,
                       with_projector=projector, run=name, describe=describe,
                       card_extra=card_sections, replaceable=replaceable)
    storage.release_dir(dest)  # its config.json says it is an export from now on
    return dest


def main(run_dir: str, checkpoint: str | None = None, fmt: str = "safetensors",
         projector: bool = False, out: str | None = None) -> int:
    from components.io.paths import resolve_path

    def body() -> None:
        check_format(fmt)  # before any loading: a typo fails at once
        run = resolve_path(run_dir)  # relative: against $SIMGRAPH_BASE_DIR
        dest = export_run(run, resolve_path(checkpoint) if checkpoint else None, fmt,
                          projector, resolve_path(out) if out else None)
        from components.io.storage import join

        print(join(dest, CARD))

    return run_command("export", body)


__all__ = ["ExportError", "export_run", "load_run", "main"]

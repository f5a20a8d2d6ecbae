"""Step 5b: ``manifest.json``, written last (:func:`_assemble`: counts, fields, shard list,
sha256s, caption model, skipped items, library versions); whether a dir holds a complete
manifest for a set of parameters whose split files verify (:func:`_verified_manifest`);
removing the per-shard files once it is written (:func:`_cleanup`); the table printed after a
build (:func:`summary`). Readers load the manifest through ``components/data/reader.py``."""

from __future__ import annotations

import collections
import datetime
import platform
import time
from pathlib import Path
from typing import Any

from components.config import PreprocessConfig
from components.data import captions as cap
from components.data import shards
from components.data.build.common import PreprocessError, _read_json
from components.data.build.listing import NO_CAPTION_FROM_SOURCE
from components.data.build.merging import _split_shards
from components.data.build.planning import Plan
from components.data.build.timing import BuildTimes
from components.data.shards import FORMAT, MANIFEST
from components.data.sources import skip_record
from components.data.splits import SPLITS
from components.io.files import sha256_file, write_json


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("simgraph", "ray", "ffcv", "torch", "numpy", "pillow", "sentence-transformers"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _verified_manifest(out: Path, params_digest: str) -> dict[str, Any] | None:
    m = _read_json(out / MANIFEST)
    if not m or not m.get("complete") or m.get("params_digest") != params_digest:
        return None
    for split in m["splits"].values():
        f = out / split["file"]
        if split["samples"] and (not f.exists() or sha256_file(f) != split["sha256"]):
            return None
    return m


def _assemble(
    cfg: PreprocessConfig, out: Path, params: dict[str, Any], params_digest: str, p: Plan,
    sides: dict[str, dict[str, Any]], merged: dict[str, str | None], class_files: dict[str, str],
    dim: int, caption_checks: dict[str, Any] | None,
    backend_check: dict[str, Any] | None = None, source: dict[str, Any] | None = None,
    times: BuildTimes | None = None,
) -> dict[str, Any]:
    """The manifest of a finished build; ``backend_check``: what ``captions.backend: auto``
    chose and why (``components.data.caption_backend.BackendChoice``), when it ran;
    ``source``: the source it was built from (``SourceRecord.summary``: its file, item count
    and digest); ``times``: the build's clock, whose seconds per stage go under
    ``build_seconds`` (its ``manifest`` stage: this assembly, up to the JSON written)."""
    started = time.perf_counter()
    classes, texts = p.classes, p.texts
    splits: dict[str, Any] = {}
    for split in SPLITS:
        names = _split_shards(sides, split)
        per_class: collections.Counter[str] = collections.Counter()
        for n in names:
            for lab, c in sides[n]["labels"].items():
                per_class[classes[int(lab)] if int(lab) >= 0 else "unlabelled"] += c
        splits[split] = {
            "file": f"{split}.beton", "samples": sum(sides[n]["samples"] for n in names),
            "sha256": merged[split],
            "per_class": dict(sorted(per_class.items())), "shards": names,
        }
    all_skipped = [skip_record(s) for s in p.skipped]
    for name in sorted(sides):
        all_skipped += sides[name]["skipped"]
    if not any(s["samples"] for s in splits.values()):
        raise PreprocessError(
            f"every item was skipped ({len(all_skipped)}): see the reasons in "
            f"{out / 'shards'}/*.json; nothing to train on"
        )
    fields: dict[str, Any] = {
        shards.IMAGE: {"type": "RGBImageField", "write_mode": cfg.image.write_mode,
                       "max_side": cfg.image.max_side},
        shards.LABEL: {"type": "IntField", "dtype": "int64", "unlabelled": -1},
        shards.SAMPLE_ID: {"type": "IntField", "dtype": "int64"},
    }
    if cfg.captions.enabled:
        fields[shards.CAPTION] = {"type": "NDArrayField", "dtype": cfg.captions.dtype,
                                  "shape": [dim], "normalised": True,
                                  # numba has no float16: FFCV stores its bit pattern
                                  "stored_as": "int16" if cfg.captions.dtype == "float16"
                                  else "float32"}
    manifest = {
        "format": FORMAT,
        "complete": True,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "params": params,
        "params_digest": params_digest,
        "classes": classes,
        "splits": splits,
        "shards": [
            {k: v for k, v in sides[n].items() if k not in ("skipped", "digest")}
            for n in sorted(sides)
        ],
        "fields": fields,
        "encoder": (
            {"model": cfg.captions.model, "path": cap.resolve_model(cfg.captions.model),
             "dim": dim, "unique_captions": len(texts), "backend": cfg.captions.backend,
             **({} if backend_check is None else {"backend_check": backend_check})}
            if cfg.captions.enabled else None
        ),
        "class_files": class_files,
        "skipped": {
            "total": len(all_skipped),
            "by_reason": dict(collections.Counter(s["reason"] for s in all_skipped)),
            "items": all_skipped,
        },
        "near_duplicates": p.near_duplicates,
        "split_groups": p.split_groups,
        "caption_checks": caption_checks,
        "source": source,
        "versions": versions(),
    }
    clock = times if times is not None else BuildTimes()
    clock.add("manifest", time.perf_counter() - started)
    # Seconds of this run, not part of the dataset's identity (params_digest): a rebuild's
    # manifest differs only here and in "created".
    manifest["build_seconds"] = clock.as_dict()
    write_json(out / MANIFEST, manifest)
    return manifest


def _cleanup(out: Path, cfg: PreprocessConfig, manifest: dict[str, Any]) -> None:
    """After the manifest is written: drop per-shard files unless asked to keep them."""
    if cfg.keep_shards:
        return
    for p in (out / "shards").glob("*.beton*"):
        p.unlink()


def summary(manifest: dict[str, Any]) -> str:
    lines = ["", f"{'split':<8}{'samples':>10}  classes"]
    for name, s in manifest["splits"].items():
        # classes: the labelled ones ("unlabelled" counts the items without a label)
        lines.append(f"{name:<8}{s['samples']:>10}  "
                     f"{sum(1 for c in s['per_class'] if c != 'unlabelled')}")
    sk = manifest["skipped"]
    lines.append(f"skipped: {sk['total']}" + (
        " (" + ", ".join(f"{r}: {n}" for r, n in sorted(sk["by_reason"].items())) + ")"
        if sk["total"] else ""))
    checks = manifest.get("caption_checks") or {}
    lines += [f"captions: {n['detail']}" for n in checks.get("items", [])
              if n.get("reason") == NO_CAPTION_FROM_SOURCE]
    return "\n".join(lines)

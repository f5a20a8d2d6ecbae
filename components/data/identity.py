"""What identifies a dataset dir's content (from its ``manifest.json``): stored in checkpoints
and a run dir's ``dataset.json``, compared before a run resumes, before its loaders open a split
file, and before evaluation, so nothing trains or scores on another dataset than it started
with."""

from __future__ import annotations

from typing import Any


def dataset_identity(manifest: dict[str, Any]) -> dict[str, Any]:
    """What identifies a dataset dir's content: stored in checkpoints, so evaluation can refuse
    a dataset other than the one a run trained on."""
    return {
        "params_digest": manifest.get("params_digest"),
        "splits": {k: v.get("sha256") for k, v in manifest.get("splits", {}).items()},
        "classes": list(manifest.get("classes", [])),
    }


def identity_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two :func:`dataset_identity` values, in words (empty: the same)."""
    out = []
    if old.get("params_digest") != new.get("params_digest"):
        out.append("build parameters")
    a, b = old.get("splits") or {}, new.get("splits") or {}
    changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if changed:
        out.append(f"split files ({', '.join(changed)})")
    if list(old.get("classes") or []) != list(new.get("classes") or []):
        out.append("classes")
    return out

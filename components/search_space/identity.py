"""What a resumed sweep must match: the experiment's identity written when it starts
(:data:`SWEEP_RECORD`) and what changed since, in words."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.config import flatten, load_yaml

if TYPE_CHECKING:
    from components.search_space.sweep_file import SweepConfig

SWEEP_RECORD = "sweep_started.json"  # in the sweep dir, written when the sweep starts


def sweep_identity(path: str | Path, sweep: SweepConfig,
                   overrides: Sequence[str]) -> dict[str, Any]:
    """What defines the experiment a sweep runs: its file and base config as parsed (comments
    and layout do not count; the same files moved elsewhere do not either) and the
    command-line overrides. Stored as :data:`SWEEP_RECORD` when the sweep starts."""
    return {"sweep_file": str(Path(path).resolve()), "sweep": load_yaml(path),
            "base_file": str(sweep.base_path), "base": load_yaml(sweep.base_path),
            "overrides": list(overrides)}


def identity_changes(started: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What changed between two :func:`sweep_identity` values, in words (empty: nothing)."""
    out = []
    for part, what in (("sweep", "sweep file"), ("base", "base config")):
        a, b = flatten(started.get(part) or {}), flatten(now.get(part) or {})
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)
                      # the confirmation stage runs after the search: not part of it
                      and not (part == "sweep" and k.split(".")[0] == "confirm"))
        if keys:
            more = f" and {len(keys) - 6} more" if len(keys) > 6 else ""
            out.append(f"{what} {now[part + '_file']}: {', '.join(keys[:6])}{more}")
    if list(started.get("overrides") or []) != list(now.get("overrides") or []):
        out.append(f"command-line overrides: {started.get('overrides')} then, "
                   f"{now.get('overrides')} now")
    return out


# ---------------------------------------------------------------------------------------------
# Optuna and trials.

"""What every stage of the build shares: :class:`PreprocessError`, the digest that keys plans
and caches (:func:`_digest`), reading a JSON file that may be missing or damaged
(:func:`_read_json`), and how much of a long report the manifest lists in full
(``LISTED_MAX``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from components.errors import SimgraphError

LISTED_MAX = 1000  # near-duplicate groups / truncated captions listed in full in the manifest


class PreprocessError(SimgraphError, RuntimeError):
    """Preprocessing cannot produce a usable dataset (the message says why and what to do)."""


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None

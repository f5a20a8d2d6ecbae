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
    """A state file simgraph wrote (a JSON object), ``None`` when missing or unreadable.

    Raises:
        PreprocessError: it holds valid JSON that is not an object (not written by simgraph).
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        kind = {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
            type(data), "number")
        raise PreprocessError(
            f"{path} holds a JSON {kind}, expected an object (the file simgraph writes there): "
            "it is not simgraph's; move it aside or choose another output")
    return data

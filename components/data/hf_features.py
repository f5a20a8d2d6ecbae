"""What ``datasets`` writes about a column — its feature, from ``dataset_info.json`` or the
``huggingface`` metadata in an Arrow / Parquet file's schema — and a ``ClassLabel``'s names and
cells, for the ``huggingface`` and ``parquet`` sources (a Hugging Face Parquet export carries
the same metadata)."""

from __future__ import annotations

import json
from typing import Any

from components.data.sources import SourceError


def hf_feature(schema: Any, column: str | None,
               features: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The ``datasets`` feature of ``column``: from ``features`` (a ``dataset_info.json``'s),
    else the ``huggingface`` metadata ``datasets`` writes into an Arrow or Parquet file's
    schema (a ``save_to_disk`` file, a Hugging Face Parquet export)."""
    if column is None:
        return None
    if features is None and schema.metadata and b"huggingface" in schema.metadata:
        try:
            meta = json.loads(schema.metadata[b"huggingface"])
            features = meta.get("info", {}).get("features")
        except (ValueError, AttributeError):
            features = None
    got = features.get(column) if isinstance(features, dict) else None
    return got if isinstance(got, dict) else None


def class_label_names(feature: dict[str, Any] | None) -> list[str] | None:
    """A ``ClassLabel`` feature's names (``None``: not a ClassLabel).

    Raises:
        SourceError: a ClassLabel without a list of names.
    """
    if feature is None or feature.get("_type") != "ClassLabel":
        return None
    names = feature.get("names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SourceError(f"a ClassLabel feature without its names list: {feature!r}")
    return names


def class_label_value(raw: object, names: list[str]) -> tuple[object, str | None]:
    """``(label, problem)`` of a ClassLabel cell: its name; ``None`` for ``-1`` (``datasets``'
    "no label") or a null; ``problem`` for an index outside the names (an ``unknown-label``)."""
    if raw is None or raw == -1:
        return None, None
    if not isinstance(raw, int) or not 0 <= raw < len(names):
        return raw, f"ClassLabel index {raw} is outside its {len(names)} names"
    return names[raw], None

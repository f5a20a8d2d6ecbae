"""Another label set for the same dataset: map each class to a group (coarse labels), so a run
trained on fine labels is scored against coarse structure without retraining (X-CLR's claim
that soft targets keep the similarity between classes, xclr.txt Sec. 4).

A label map is a YAML (or JSON) mapping ``class name -> group name`` that names every class of
the dataset exactly once; groups are numbered in sorted order. ``depth:N`` instead groups
folder-path class names (``source.label_depth``: ``animals/birds``) by their first N folders
(``depth:1``: ``animals``), with no file to write.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import yaml
from torch import Tensor

from components.config.checks import ConfigError
from components.config.loading import safe_load
from components.errors import SimgraphError


class LabelMapError(SimgraphError, ValueError):
    """The label map does not fit the dataset's classes; the message says which."""


def load_label_map(path: str | Path, classes: Sequence[str]) -> tuple[list[str], Tensor]:
    """``(groups, index)``: the sorted group names and ``index [C]`` (int64) with
    ``index[c]`` = the group of class ``c``, so ``index[labels]`` relabels a tensor.

    Raises:
        LabelMapError: unreadable file, not a mapping of strings, a class missing from it, a
            name that is not a class of the dataset, or fewer than 2 groups.
    """
    spec = str(path)
    if spec.startswith(DEPTH_PREFIX):
        return _by_depth(spec, classes)
    try:
        raw = safe_load(Path(path).read_text(), str(path))  # JSON is YAML
    except (OSError, yaml.YAMLError, ConfigError) as e:
        raise LabelMapError(f"cannot read label map {path}: {e}") from None
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str | int) for k, v in raw.items()
    ):
        raise LabelMapError(f"label map {path} must be a mapping 'class name: group name'")
    mapping = {k: str(v) for k, v in raw.items()}
    unknown = sorted(set(mapping) - set(classes))
    if unknown:
        raise LabelMapError(
            f"label map {path} names {unknown[:5]} which are not classes of this dataset "
            f"(its classes: {list(classes)[:12]}{' ...' if len(classes) > 12 else ''})"
        )
    missing = [c for c in classes if c not in mapping]
    if missing:
        raise LabelMapError(
            f"label map {path} gives no group for {len(missing)} classes: {missing[:5]}; "
            "map every class"
        )
    groups = sorted(set(mapping.values()))
    if len(groups) < 2:
        raise LabelMapError(f"label map {path} puts every class in {groups}; the metrics need "
                            "at least 2 groups")
    return _numbered(mapping, classes)


DEPTH_PREFIX = "depth:"


def _by_depth(spec: str, classes: Sequence[str]) -> tuple[list[str], Tensor]:
    value = spec.removeprefix(DEPTH_PREFIX)
    if not value.isdigit() or int(value) < 1:
        raise LabelMapError(f"--labels {spec!r}: the depth must be a whole number >= 1 "
                            "(e.g. depth:1 groups animals/birds under animals)")
    depth = int(value)
    mapping = {c: "/".join(c.split("/")[:depth]) for c in classes}
    groups = sorted(set(mapping.values()))
    if len(groups) < 2 or len(groups) == len(set(classes)):
        raise LabelMapError(
            f"--labels {spec}: grouping the {len(classes)} classes by their first {depth} "
            f"folder(s) gives {len(groups)} groups ({groups[:5]}...); it needs at least 2 and "
            "fewer than the classes — build the dataset with a deeper source.label_depth"
        )
    return _numbered(mapping, classes)


def _numbered(mapping: dict[str, str], classes: Sequence[str]) -> tuple[list[str], Tensor]:
    groups = sorted(set(mapping.values()))
    number = {g: i for i, g in enumerate(groups)}
    return groups, torch.tensor([number[mapping[c]] for c in classes], dtype=torch.long)

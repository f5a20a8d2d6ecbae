"""Pretrained starts from a local file (``model.init``): read a state dict, map its keys onto
the encoder's backbone (and projector), report what matched, load it.

What a file may hold (``.safetensors``, or ``.pth`` / ``.pt`` read with
``torch.load(weights_only=True)``; local paths only, never downloaded):

* a timm model's ``state_dict()`` (its classifier ``head.*`` / ``fc.*`` ignored), a torchvision
  ResNet's (``conv1.weight``, ``layer1.0.*``; ``fc.*`` ignored), a ``simgraph export``
  ``model.safetensors`` (the backbone's own keys), or a simgraph checkpoint's ``model`` state
  (``encoder.backbone.*``, ``encoder.projector.*``);
* wrapped: a dict whose tensors sit under ``state_dict`` / ``model`` / ``teacher`` (DINO's
  checkpoint) is unwrapped first, one level after another.

**The key rule.** The file's keys are ``<prefix><key of the backbone>``: of every prefix that
makes some file key a backbone key (``""``, ``module.``, ``backbone.``,
``teacher.backbone.``, ``module.encoder.backbone.`` …), the one matching the most backbone
tensors is taken (a tie: the longest, then the alphabetically last, so a flat DINO / solo-learn
dict with both ``student.backbone.*`` and ``teacher.backbone.*`` gives the teacher's). The
projector loads from ``<p>projector.*`` where ``<p>`` is the backbone prefix with its last
``backbone.`` replaced (simgraph's ``encoder.projector.*``) and only when all its tensors are
there with the same shapes; else it stays random. Keys under ``head.`` / ``fc.`` /
``classifier.`` are ignored (a classifier); any other unused key is listed as unexpected;
backbone tensors the file lacks stay at their random init and are listed as missing.

**Position embeddings of another size.** A timm ViT-like backbone built for the run's
resolution has ``pos_embed [1, prefix + h·w, D]`` for its ``h × w`` patch grid; a file made at
another size (ImageNet's 224 px: 14 × 14) has another grid. Such a ``pos_embed`` (same width D,
a square grid after the same prefix tokens) is resampled to the run's grid with timm's own
``resample_abs_pos_embed`` (bicubic, antialiased; the class / register tokens' rows kept as
they are), as timm does when it loads a checkpoint at another ``img_size``, and the plan says
so.

Refused (:class:`InitWeightsError`, one line): a missing or unreadable file, a file whose keys
match no backbone tensor, a matched tensor of another shape (naming it and both shapes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.errors import SimgraphError

if TYPE_CHECKING:
    import torch
    from torch import nn

SUFFIXES = (".safetensors", ".pth", ".pt")
WRAPPERS = ("state_dict", "model", "teacher")  # unwrapped in this order, level after level
CLASSIFIER_PREFIXES = ("head.", "fc.", "classifier.")
SHOWN = 5  # keys shown in a list before "… (N more)"


class InitWeightsError(SimgraphError, ValueError):
    """``model.init`` cannot start the run: the file is missing or unreadable, or its tensors
    do not fit the configured backbone (one line naming the path and what is wrong)."""


def check_init_path(path: str) -> None:
    """The config-time check (cheap): a local file with a known suffix exists.

    Raises:
        InitWeightsError: a URI, another suffix, or no such file.
    """
    if "://" in path:
        raise InitWeightsError(f"model.init={path!r}: only local files are read (a URI is "
                               f"never downloaded); copy the file here and give its path")
    if not path.endswith(SUFFIXES):
        raise InitWeightsError(f"model.init={path!r}: give a {' / '.join(SUFFIXES)} file "
                               f"holding a state dict")
    if not Path(path).is_file():
        raise InitWeightsError(f"model.init={path!r}: no such file")


def read_state_dict(path: str, data: bytes | None = None) -> dict[str, torch.Tensor]:
    """The file's tensors by key (wrappers unwrapped: module docstring), on the CPU. ``data``:
    the file's bytes, read elsewhere (a worker on another node than the driver that read the
    file: :func:`components.runs.recipe.make_trainer` ships them); ``path`` then only names it
    and gives its format.

    Raises:
        InitWeightsError: missing or unreadable, or no tensors in it (names the path).
    """
    import io

    import torch

    if data is None:
        check_init_path(path)
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load, load_file

            raw: Any = load_file(path, device="cpu") if data is None else load(data)
        elif data is None:
            raw = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        else:
            raw = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any reader's error: one line naming the path
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise InitWeightsError(f"model.init={path!r} cannot be read ({first})") from None
    while isinstance(raw, Mapping) and not any(isinstance(v, torch.Tensor)
                                               for v in raw.values()):
        inner = next((raw[w] for w in WRAPPERS if isinstance(raw.get(w), Mapping)), None)
        if inner is None:
            break
        raw = inner
    tensors = {str(k): v for k, v in raw.items()
               if isinstance(v, torch.Tensor)} if isinstance(raw, Mapping) else {}
    if not tensors:
        raise InitWeightsError(f"model.init={path!r} holds no state dict (no tensors under "
                               f"its top level or {' / '.join(WRAPPERS)})")
    return tensors


def _listed(keys: list[str]) -> str:
    shown = ", ".join(keys[:SHOWN])
    return shown + (f" … ({len(keys) - SHOWN} more)" if len(keys) > SHOWN else "")


@dataclasses.dataclass(frozen=True)
class InitPlan:
    """Which file tensor goes to which backbone / projector tensor, and what is left over."""

    path: str
    backbone: dict[str, str]  # backbone key -> file key
    projector: dict[str, str]  # projector key -> file key (empty: it stays random)
    backbone_total: int
    missing: list[str]  # backbone keys the file lacks (they stay random)
    ignored: list[str]  # classifier keys in the file
    unexpected: list[str]  # other file keys not used
    # backbone key -> (the file's patch grid, the run's): position embeddings resampled
    resampled: dict[str, tuple[tuple[int, int], tuple[int, int]]] = dataclasses.field(
        default_factory=dict)

    def summary(self) -> str:
        """The run summary's line: ``init  <path>: 102 of 102 backbone tensors (projector:
        random); ignored: head.weight, head.bias``."""
        proj = "from the file" if self.projector else "random"
        parts = [f"{self.path}: {len(self.backbone)} of {self.backbone_total} backbone "
                 f"tensors (projector: {proj})"]
        for t, (was, now) in self.resampled.items():
            parts.append(f"{t} resampled from {was[0]}x{was[1]} to {now[0]}x{now[1]} patches")
        if self.missing:
            parts.append(f"missing (random init): {_listed(self.missing)}")
        if self.ignored:
            parts.append(f"ignored: {_listed(self.ignored)}")
        if self.unexpected:
            parts.append(f"unexpected: {_listed(self.unexpected)}")
        return "; ".join(parts)


def _best_prefix(keys: list[str], targets: Mapping[str, Any]) -> tuple[str, int]:
    """The prefix ``p`` with the most keys ``p + t`` for ``t`` in ``targets`` (a tie: the
    longest, then the alphabetically last: ``teacher.`` over ``student.``), and that count
    (0: nothing matches)."""
    counts: dict[str, int] = {}
    for key in keys:
        cuts = [0] + [i + 1 for i, c in enumerate(key) if c == "."]
        for i in cuts:
            if key[i:] in targets:
                counts[key[:i]] = counts.get(key[:i], 0) + 1
    if not counts:
        return "", 0
    best = max(counts, key=lambda p: (counts[p], len(p), p))
    return best, counts[best]


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


@dataclasses.dataclass(frozen=True)
class PosEmbed:
    """A ViT-like backbone's ``pos_embed`` layout: ``prefix`` rows (class / register tokens)
    before the ``grid`` (h, w) of patches."""

    prefix: int
    grid: tuple[int, int]


def pos_embed_layout(backbone: Any) -> PosEmbed | None:
    """The layout of a timm backbone's absolute position embeddings (``pos_embed [1, prefix +
    h·w, D]``, ``patch_embed.grid_size``), or ``None`` for a backbone without them."""
    pos = getattr(backbone, "pos_embed", None)
    grid = getattr(getattr(backbone, "patch_embed", None), "grid_size", None)
    if pos is None or grid is None or getattr(pos, "ndim", 0) != 3:
        return None
    prefix = 0 if getattr(backbone, "no_embed_class", False) else int(
        getattr(backbone, "num_prefix_tokens", 0))
    h, w = (int(g) for g in grid)
    return PosEmbed(prefix, (h, w)) if pos.shape[1] == prefix + h * w else None


def _file_grid(shape: tuple[int, ...], target: tuple[int, ...],
               layout: PosEmbed) -> tuple[int, int] | None:
    """The square patch grid of a file's ``pos_embed`` of ``shape`` that can be resampled to
    ``target`` (same batch of 1 and width, the same prefix rows), else ``None``."""
    if len(shape) != 3 or shape[0] != 1 or shape[2] != target[2]:
        return None
    side = math.isqrt(max(shape[1] - layout.prefix, 0))
    return (side, side) if side > 0 and side * side == shape[1] - layout.prefix else None


def plan_init(path: str, tensors: Mapping[str, Any], backbone: Mapping[str, Any],
              projector: Mapping[str, Any], backbone_name: str,
              pos_embed: PosEmbed | None = None) -> InitPlan:
    """Map ``tensors`` (the file's) onto ``backbone`` / ``projector`` (their state dicts, or
    anything with shapes: a meta-device build's) by the module docstring's rule.
    ``pos_embed``: the backbone's position-embedding layout (:func:`pos_embed_layout`), which
    lets a ``pos_embed`` of another square grid be resampled.

    Raises:
        InitWeightsError: nothing matches, or a matched tensor's shape differs (and is not a
            position embedding that can be resampled).
    """
    keys = list(tensors)
    prefix, n = _best_prefix(keys, backbone)
    if n == 0:
        raise InitWeightsError(
            f"model.init={path!r}: 0 of {len(backbone)} tensors matched: is this a "
            f"{backbone_name} state dict? (its keys: {_listed(keys)}; {backbone_name}'s: "
            f"{_listed(list(backbone))})")
    mapped = {t: prefix + t for t in backbone if prefix + t in tensors}
    head = (prefix[:prefix.rfind("backbone.")] + "projector."
            if prefix.endswith("backbone.") else None)
    proj: dict[str, str] = {}
    if head is not None and all(head + t in tensors for t in projector) and all(
            _shape(tensors[head + t]) == _shape(v) for t, v in projector.items()):
        proj = {t: head + t for t in projector}
    resampled: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {}
    for t, k in mapped.items():
        if _shape(tensors[k]) != _shape(backbone[t]):
            grid = (None if pos_embed is None or t != "pos_embed"
                    else _file_grid(_shape(tensors[k]), _shape(backbone[t]), pos_embed))
            if grid is not None:
                resampled[t] = (grid, pos_embed.grid)  # type: ignore[union-attr]
                continue
            raise InitWeightsError(
                f"model.init={path!r}: tensor {k} has shape {list(_shape(tensors[k]))} but "
                f"{backbone_name}'s {t} has shape {list(_shape(backbone[t]))} (another "
                f"architecture or size: match model.backbone, model.width / blocks, "
                f"small_images and data.augment.resolution to the file's)")
    used = set(mapped.values()) | set(proj.values())
    rest = [k for k in keys if k not in used]
    ignored = [k for k in rest if k[len(prefix):].startswith(CLASSIFIER_PREFIXES)
               and k.startswith(prefix)]
    return InitPlan(path=path, backbone=mapped, projector=proj, backbone_total=len(backbone),
                    missing=[t for t in backbone if t not in mapped], ignored=ignored,
                    unexpected=[k for k in rest if k not in ignored], resampled=resampled)


def plan_for(path: str, encoder: nn.Module, backbone_name: str,
             tensors: Mapping[str, Any] | None = None) -> InitPlan:
    """:func:`plan_init` for ``encoder`` (an :class:`~components.models.encoders.Encoder`,
    built for real or on the meta device); ``tensors``: the file's, read when None."""
    if tensors is None:
        tensors = read_state_dict(path)
    backbone: Any = encoder.backbone
    projector: Any = encoder.projector
    return plan_init(path, tensors, backbone.state_dict(), projector.state_dict(),
                     backbone_name, pos_embed_layout(backbone))


def check_init(path: str, model: Any, resolution: int | None) -> InitPlan:
    """The driver's check before anything runs: ``model`` (a ModelConfig)'s encoder built on
    the meta device (shapes only) and the file's keys mapped onto it.

    Raises:
        InitWeightsError: as :func:`read_state_dict` and :func:`plan_init`.
    """
    import torch

    from components.models.encoders import build_encoder

    tensors = read_state_dict(path)
    with torch.device("meta"):
        encoder = build_encoder(model, resolution)
    return plan_for(path, encoder, model.backbone, tensors)


def load_init(encoder: nn.Module, path: str, backbone_name: str,
              data: bytes | None = None) -> InitPlan:
    """Read ``path`` (or its bytes ``data``, read elsewhere) and copy its matched tensors into
    ``encoder``'s backbone (and projector, when the file has one that fits), in place (any
    device, dtype converted).

    Raises:
        InitWeightsError: as :func:`read_state_dict` and :func:`plan_init`.
    """
    import torch

    tensors = read_state_dict(path, data)
    plan = plan_for(path, encoder, backbone_name, tensors)
    layout = pos_embed_layout(encoder.backbone)
    with torch.no_grad():
        for part, mapping in (("backbone", plan.backbone), ("projector", plan.projector)):
            state = getattr(encoder, part).state_dict()
            for t, k in mapping.items():
                value = tensors[k]
                if part == "backbone" and t in plan.resampled and layout is not None:
                    from timm.layers import resample_abs_pos_embed

                    was, now = plan.resampled[t]
                    value = resample_abs_pos_embed(value.float(), new_size=list(now),
                                                   old_size=list(was),
                                                   num_prefix_tokens=layout.prefix)
                state[t].copy_(value)
    return plan

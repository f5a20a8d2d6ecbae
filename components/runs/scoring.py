"""A run's checkpoint scored on a split of its dataset — what ``simgraph evaluate``
(:mod:`pipelines.evaluate`) and a sweep's confirmation stage share: the run read back
(:func:`load_run`: :func:`components.runs.run_dir.load_run` failing with
:class:`EvaluateError`; its ``dataset()`` checked to be the one it trained on), the evaluation
view of a split (:func:`eval_loader`), its features (:func:`split_features`), and
per-image kNN hits by the one kNN rule (:func:`split_knn_hits`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from components.config import PretrainConfig
from components.errors import SimgraphError
from components.runs.run_dir import LoadedRun
from components.runs.run_dir import load_run as read_run

if TYPE_CHECKING:  # torch and the readers load only when a run is scored
    from components.data.reader import ViewLoader


class EvaluateError(SimgraphError, RuntimeError):
    """A run cannot be evaluated; the message says why and what to do."""


def load_run(run_dir: str | Path, checkpoint: str | Path | None = None) -> LoadedRun:
    """:func:`components.runs.run_dir.load_run` for ``simgraph evaluate`` and a sweep's
    confirmation stage.

    Raises:
        EvaluateError: see :func:`components.runs.run_dir.load_run`.
    """
    return read_run(run_dir, checkpoint, error=EvaluateError, command="evaluate")


def eval_loader(cfg: PretrainConfig, info: Any, split: str, device: Any) -> ViewLoader:
    """The evaluation view of every image of ``split`` (centre crop, no augmentation), in the
    split file's order, one view per image."""
    from components.data.reader import ViewLoader

    return ViewLoader(info.split_file(split), batch_size=cfg.data.batch_size, views=1,
                      augment=cfg.data.augment, train=False, device=device,
                      num_workers=cfg.data.num_workers, with_captions=False)


def split_features(cfg: PretrainConfig, info: Any, encoder: Any, split: str, device: Any,
                   projector: bool = False, name: str = "",
                   loader: ViewLoader | None = None) -> tuple[Any, Any]:
    """(features [N, D], labels [N]) of every image of ``split`` through the evaluation view
    (:func:`eval_loader`, or ``loader`` when given: one built by it for this split), in the
    split file's order."""
    from components.training.step import extract_features

    if loader is None:
        loader = eval_loader(cfg, info, split, device)
    return extract_features(encoder, _progress(loader, f"{name}: {split}"), device,
                            projector=projector)


def split_knn_hits(run_dir: str, split: str, *, device: str | None = None,
                   jit: bool | None = None) -> np.ndarray:
    """[N] bool per image of ``split``: whether the run's newest checkpoint classifies it right
    by the one kNN rule (:class:`~components.evaluation.knn.KnnRule` of the run's ``knn``
    section: the online monitor's and ``evaluate``'s) — what a sweep's confirmation stage
    scores on a split no trial was chosen on. ``device``: ``None`` (what the sweep passes) is
    the device of the resources the calling Ray task was given — ``cuda:0`` when it holds a
    GPU, else the CPU, whatever GPUs the node has (:func:`~components.data.devices.resolve_device`).

    Raises:
        EvaluateError: the run cannot be read, its dataset has no labels or no images in
            ``split``.
    """
    from components.data.devices import resolve_device
    from components.data.reader import set_jit
    from components.evaluation.knn import KnnRule

    dev = resolve_device(device)
    run = load_run(run_dir)
    cfg, info = run.config, run.dataset()
    if not info.splits.get(split, 0):
        raise EvaluateError(f"{info.root} has no {split} images to score on; preprocess with "
                            f"split.{split} > 0")
    set_jit(cfg.data.jit if jit is None else jit)
    encoder = run.encoder().to(dev)
    rule = KnnRule.of(cfg.knn)
    bank_f, bank_y = split_features(cfg, info, encoder, rule.bank_split, dev)
    query_f, query_y = split_features(cfg, info, encoder, split, dev)
    return rule.hits(bank_f, bank_y, query_f, query_y, len(info.classes)).cpu().numpy()


def _progress(loader: Any, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(loader, desc=desc, total=len(loader), leave=False, disable=not sys.stderr.isatty())

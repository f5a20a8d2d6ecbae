"""A small synthetic dataset dir in the preprocess format (no Ray needed to build it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from components.data.reader import FORMAT, MANIFEST
from components.data.shards import page_size_for, write_shard
from components.io.files import sha256_file


def _image(rng: np.random.Generator, cls: int, size: int) -> np.ndarray:
    """Class ``cls``: a stripe pattern whose orientation and colour depend on the class."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float64)
    angle = np.pi * cls / 4
    wave = np.sin((x * np.cos(angle) + y * np.sin(angle)) * (0.6 + 0.1 * cls))
    colour = np.array([(cls * 70) % 256, (cls * 130 + 60) % 256, (cls * 190 + 120) % 256])
    noise = rng.normal(0, 12, (size, size, 3))
    img = 127 + 100 * wave[..., None] * (colour / 255.0)[None, None] + noise
    return np.clip(img, 0, 255).astype(np.uint8)


def synthetic_dataset(
    root: Path, *, classes: int = 4, train_per_class: int = 32, val_per_class: int = 8,
    size: int = 16, caption_dim: int = 8, seed: int = 0, test_per_class: int = 0,
) -> Path:
    """Write ``train.beton`` / ``val.beton`` (and ``test.beton`` when ``test_per_class``),
    ``class_similarity.npy`` and ``manifest.json``."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    class_emb = rng.standard_normal((classes, caption_dim)).astype(np.float32)
    class_emb /= np.linalg.norm(class_emb, axis=1, keepdims=True)
    np.save(root / "class_similarity.npy", class_emb @ class_emb.T)
    splits = {}
    next_id = 0
    for split, per in (("train", train_per_class), ("val", val_per_class),
                       ("test", test_per_class)):
        if split == "test" and not per:
            continue
        labels = np.repeat(np.arange(classes), per)
        ids = np.arange(next_id, next_id + len(labels))
        next_id += len(labels)
        caps = class_emb[labels] + 0.1 * rng.standard_normal((len(labels), caption_dim))
        caps = (caps / np.linalg.norm(caps, axis=1, keepdims=True)).astype(np.float32)
        write_shard(root / f"{split}.beton", [_image(rng, int(c), size) for c in labels],
                    labels, ids, caps, write_mode="raw", jpeg_quality=90,
                    page_size=page_size_for(size, caption_dim * 4))
        splits[split] = {"samples": len(labels), "file": f"{split}.beton",
                         "sha256": sha256_file(root / f"{split}.beton")}
    manifest = {
        "format": FORMAT, "complete": True, "classes": [f"class{c}" for c in range(classes)],
        "params_digest": f"synthetic-{classes}-{train_per_class}-{val_per_class}-{size}-{seed}"
                         + (f"-t{test_per_class}" if test_per_class else ""),
        "splits": splits,
        "fields": {"caption": {"type": "NDArrayField", "dtype": "float32",
                               "shape": [caption_dim]}},
        "class_files": {"class_similarity": "class_similarity.npy"},
    }
    (root / MANIFEST).write_text(json.dumps(manifest))
    return root


def tiny_run_config(dataset: Path, storage: Path, **over: Any) -> dict[str, Any]:
    """A pretrain config for the synthetic dataset: a small ConvNet, 2 CPU workers, 4 epochs;
    ``a__b=v`` overrides ``cfg[a][b]``."""
    cfg: dict[str, Any] = {
        "name": "run",
        "storage": str(storage),
        # jit off: exact resume needs FFCV's augmentations on numpy's (seeded) generator.
        "data": {"dataset": str(dataset), "batch_size": 16, "num_workers": 1, "jit": False,
                 "augment": {"resolution": 16}},
        "model": {"backbone": "convnet", "width": 8, "blocks": 2, "projector_hidden": 32,
                  "projector_dim": 16},
        "loss": {"name": "supcon", "tau": 0.2, "bank_size": 40},
        "optim": {"name": "lars", "lr": 0.2, "warmup_epochs": 1},
        "train": {"epochs": 4},
        "checkpoint": {"every_epochs": 1, "keep": 2},
        "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
        "knn": {"k": 10},
    }
    for key, value in over.items():
        node = cfg
        *path, leaf = key.split("__")
        for k in path:
            node = node.setdefault(k, {})
        node[leaf] = value
    return cfg


def run_with_checkpoint(dataset: Path, storage: Path, name: str, checkpoint: bool = True,
                        random_bn_stats: bool = False, **over: Any) -> Path:
    """A run dir of :func:`tiny_run_config` (``over`` as there) with one checkpoint after
    epoch 1, as `simgraph pretrain` leaves it (no Ray needed): a model built with seed 0.
    ``checkpoint=False``: the run dir only. ``random_bn_stats``: BatchNorm running statistics
    randomised, so that eval mode matters to what a reader of the checkpoint computes."""
    import torch

    from components.config import PretrainConfig, from_dict
    from components.data.reader import DatasetInfo
    from components.runs.dataset_checks import check_dataset
    from components.runs.run_dir import prepare_run_dir
    from components.training.step import build_model

    cfg = from_dict(PretrainConfig, tiny_run_config(dataset, storage, name=name, **over))
    run_dir = Path(prepare_run_dir(cfg))
    if not checkpoint:
        return run_dir
    facts = check_dataset(cfg)
    torch.manual_seed(0)
    sim = torch.as_tensor(DatasetInfo.load(dataset).class_similarity(), dtype=torch.float32)
    model, _ = build_model(cfg.model, cfg.loss, facts.num_classes, sim, facts.caption_dim,
                           cfg.data.augment.resolution)
    if random_bn_stats:
        with torch.no_grad():
            for key, buf in model.encoder.named_buffers():
                if key.endswith("running_mean"):
                    buf.normal_(0, 0.5)
                elif key.endswith("running_var"):
                    buf.uniform_(0.5, 2.0)
    model_checkpoint(cfg, run_dir, model, facts.dataset)
    return run_dir


def model_checkpoint(cfg: Any, run_dir: Path, model: Any, dataset: dict[str, Any]) -> Path:
    """``run_dir/epoch_00001``: a complete checkpoint of ``model`` after one epoch (no
    optimiser state: enough for evaluate, export and embed)."""
    from components.config import to_dict
    from components.runs.checkpoint import TrainingState

    return TrainingState(model=model.state_dict(), optimizer={}, scheduler={}, epoch=1,
                         step=4, history=[], config=to_dict(cfg), dataset=dataset,
                         ).save(run_dir / "epoch_00001")



def checkpoint_encoder(checkpoint: Path) -> tuple[Any, Any]:
    """``(config, encoder)`` of a checkpoint the long way round: the whole training model
    rebuilt (``build_model``, its loss included) and its state loaded strictly — a route
    independent of ``components.models.encoders.encoder_from_state``, which evaluate, export
    and embed use, so tests can check those against it."""
    import torch

    from components.config import PretrainConfig, from_dict
    from components.data.reader import DatasetInfo
    from components.runs.checkpoint import load_state
    from components.training.step import build_model

    state = load_state(checkpoint)
    cfg = from_dict(PretrainConfig, state["config"])
    info = DatasetInfo.load(cfg.data.dataset)
    sim = info.class_similarity()
    model, _ = build_model(cfg.model, cfg.loss, len(info.classes),
                           None if sim is None else torch.as_tensor(sim, dtype=torch.float32),
                           info.caption_dim, cfg.data.augment.resolution)
    model.load_state_dict(state["model"])
    return cfg, model.encoder

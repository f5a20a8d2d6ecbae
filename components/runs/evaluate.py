"""A run's checkpoint evaluated: :func:`evaluate_run` reads the run dir (through
:mod:`components.runs.scoring`), extracts frozen features of the bank and query splits and
computes every metric of ``simgraph evaluate`` into a
:class:`~components.evaluation.run_eval.RunEval` (the random-init baseline included); nothing
written (:mod:`components.evaluation.report` writes it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.config import PretrainConfig, to_dict
from components.evaluation.run_eval import RunEval, headline_of
from components.runs.scoring import (
    EvaluateError,
    eval_loader,
    load_run,
    split_features,
)

KS = (1, 5, 10, 20, 50, 100, 200)
# Hyperparameters worth a column in the comparison table, when the loss has them.
KEY_PARAMS = ("tau", "tau_s", "graph", "epsilon", "variant", "lambda_sup", "lambda_dc",
              "tau_sup", "tau_dc", "bank_size", "top_n")


def evaluate_run(run_dir: str | Path, checkpoint: str | Path | None = None, *,
                 projector: bool = False, device: str | None = None, jit: bool | None = None,
                 probe_epochs: int = 100, labels: str | Path | None = None,
                 baseline: bool = True) -> RunEval:
    """Every metric of one run (steps 1–4 of :mod:`pipelines.evaluate`); nothing written.
    ``labels``: a label map (``components.evaluation.labels``) to score against groups of the
    classes instead of the classes themselves (no retraining). ``baseline``: also score the
    random-init encoder of the run's config (its features, kNN at the headline k, probe).
    ``device``: ``cpu`` / ``cuda`` / ``cuda:N``; ``None``: from the resources this process was
    given (:func:`~components.data.devices.resolve_device`)."""
    import torch  # torch, the readers and the metrics load only when a run is evaluated

    from components.data.devices import resolve_device
    from components.data.reader import set_jit
    from components.evaluation.baseline import score_baseline
    from components.evaluation.graph import (
        class_similarity_matrix,
        graph_metrics,
        target_noise_separation,
    )
    from components.evaluation.knn import KnnRule, knn_accuracy, knn_hits
    from components.evaluation.labels import LabelMapError, load_label_map
    from components.evaluation.probe import linear_probe
    from components.evaluation.visuals import (
        embedding_map,
        nearest_neighbours,
        per_class_recall,
        pick_queries,
        with_images,
    )
    from components.io.storage import basename

    dev = resolve_device(device)  # a bad --device: before anything loads
    run = load_run(run_dir, checkpoint)
    cfg, state = run.config, run.state
    name = basename(str(run_dir))
    info = run.dataset()
    classes, index = list(info.classes), torch.arange(len(info.classes))
    if labels is not None:
        try:
            classes, index = load_label_map(labels, info.classes)
        except LabelMapError as e:
            raise EvaluateError(str(e)) from None
    set_jit(cfg.data.jit if jit is None else jit)
    sim = info.class_similarity()  # the loss's target graph over classes, when it has one
    encoder = run.encoder().to(dev)
    query_split = "test" if info.splits.get("test", 0) else "val"
    rule = KnnRule.of(cfg.knn)  # the one kNN rule: the online monitor's and confirmation's
    bank_split = rule.bank_split
    # One loader per split for everything below (trained and random-init features, the
    # neighbour grid's images): FFCV compiles each new loader (15-45 s with data.jit).
    loaders = {s: eval_loader(cfg, info, s, dev) for s in (bank_split, query_split)}

    def features(enc: Any, split: str, desc: str) -> tuple[torch.Tensor, torch.Tensor]:
        f, y = split_features(cfg, info, enc, split, dev, projector, desc, loader=loaders[split])
        return f, index.to(y.device)[y]  # the class, or its group under --labels

    bank_f, bank_y = features(encoder, bank_split, name)
    query_f, query_y = features(encoder, query_split, name)
    c = len(classes)
    rule_k = rule.k_for(len(bank_f))
    scores = rule.scores(bank_f, bank_y, query_f, c, [k for k in KS if k <= len(bank_f)])
    ks = sorted(scores)
    knn, hits = {}, {}
    for k in ks:
        acc = knn_accuracy(scores[k], query_y.to(scores[k].device), topk=(1, 5))
        knn[k] = {"top1": acc[1], "top5": acc[5]}
        hits[k] = knn_hits(scores[k], query_y, 1).cpu().numpy()
    pr = linear_probe(bank_f, bank_y, query_f, query_y, c, epochs=probe_epochs, device=dev)
    sep = target_noise_separation(bank_f, bank_y, query_f, query_y)
    graph = graph_metrics(query_f, query_y, k=min(10, len(query_f) - 1))
    learned = class_similarity_matrix(query_f, query_y, c).numpy()
    params = {k: getattr(cfg.loss, k) for k in KEY_PARAMS if hasattr(cfg.loss, k)}
    query_labels = query_y.cpu().numpy()
    k_head = headline_of(ks)
    grid = nearest_neighbours(bank_f, bank_y, query_f, query_y, pick_queries(query_labels))
    a = cfg.data.augment
    grid = with_images(grid, loaders[query_split], loaders[bank_split], a.mean, a.std)
    base = None
    start = _start_encoder(cfg, run_dir) if baseline and k_head is not None else None
    if start is not None and k_head is not None:  # the same loaders, labels, rule, k, probe
        rand, base_name = start[0].to(dev), start[1]
        rand_bank_f, _ = features(rand, bank_split, f"{name} ({base_name})")
        rand_query_f, _ = features(rand, query_split, f"{name} ({base_name})")
        base = score_baseline(rand_bank_f, bank_y, rand_query_f, query_y, c, k=k_head,
                              seed=cfg.train.seed,
                              key=_baseline_key(cfg, info, projector, labels),
                              probe_epochs=probe_epochs, device=dev,
                              temperature=rule.temperature, name=base_name)
    return RunEval(
        name=name, run_dir=str(run_dir), loss=cfg.loss.name, params=params,
        epoch=state.epoch, knn=knn,
        probe={"top1": pr.top1, "top5": pr.top5, "weight_decay": pr.weight_decay},
        separation={"margin": sep.margin, "overlap": sep.overlap,
                    "target_median": sep.target_median, "noise_median": sep.noise_median},
        graph=graph, learned_similarity=learned,
        target_similarity=sim if labels is None else None,  # the graph is over classes
        target_sims=sep.target_sims.numpy(), noise_sims=sep.noise_sims.numpy(),
        classes=classes, feature="projector" if projector else "backbone",
        label_set=None if labels is None else str(labels),
        knn_hits=hits, probe_hits=None if pr.hits1 is None else pr.hits1.numpy(),
        query_labels=query_labels, query_split=query_split,
        per_class=[] if k_head is None else per_class_recall(hits[k_head], query_labels,
                                                             classes),
        embedding_map=embedding_map(query_f, query_y), neighbours=grid, baseline=base,
        knn_rule=rule.as_dict(rule_k), knn_top1=float(hits[rule_k].mean()),
    )


def _start_encoder(cfg: PretrainConfig, run_dir: str | Path) -> tuple[Any, str] | None:
    """The encoder the run started from and its row's name
    (:func:`~components.evaluation.baseline.initial_encoder`); None, said in one line, when
    the run's ``model.init`` file is gone or is not the one it started from (its sha256 in
    the run dir's ``init.json``): no baseline rather than a wrong one."""
    from components.evaluation.baseline import initial_encoder
    from components.io.files import sha256_file
    from components.models.init_weights import InitWeightsError
    from components.runtime import console

    path = cfg.model.init
    if path:
        from components.runs.init_checks import read_run_init

        record = read_run_init(str(run_dir)) or {}
        why = None
        if not Path(path).is_file():
            why = "no longer exists"
        elif record.get("sha256") and sha256_file(path) != record["sha256"]:
            why = "is not the file the run started from (another sha256)"
        if why:
            console.say(f"[simgraph] no init-weights baseline: model.init {path} {why}")
            return None
    try:
        return initial_encoder(cfg)
    except InitWeightsError as e:
        console.say(f"[simgraph] no init-weights baseline: {e}")
        return None


def _baseline_key(cfg: PretrainConfig, info: Any, projector: bool,
                  labels: str | Path | None) -> str:
    """What makes two runs' random-init baselines the same row: the same random encoder (model
    section and seed, see components/evaluation/baseline.py), feature, data and labels."""
    return json.dumps({"model": to_dict(cfg.model), "seed": cfg.train.seed,
                       "projector": projector, "data": info.manifest.get("params_digest"),
                       "knn": [cfg.knn.temperature, cfg.knn.bank_split],
                       "labels": None if labels is None else str(labels)}, sort_keys=True,
                      default=str)

"""What a run prints before it starts (nothing silently changed): :func:`run_summary`, used
by the recipe's driver and ``simgraph validate``."""

from __future__ import annotations

from typing import Any


def run_summary(cfg: Any, facts: Any, run_dir: str) -> str:
    """What the run will do, before it starts (nothing silently changed): dataset, loss,
    model, batch and steps, the *effective* peak LR and how it was derived, the run dir.
    ``cfg``: a :class:`~components.config.PretrainConfig`; ``facts``: its
    :class:`~components.runs.dataset_checks.RunFacts`."""
    from components.config import to_dict
    from components.io.storage import display
    from components.training.optim import scaled_lr

    d, o, w = cfg.data, cfg.optim, cfg.scaling.num_workers
    gb = d.batch_size * w
    splits = " · ".join(f"{k} {v}" for k, v in facts.splits.items() if v)
    caps = f"; captions {facts.caption_dim}-d" if facts.caption_dim else ""
    loss = ", ".join(f"{k} {v}" for k, v in to_dict(cfg.loss).items() if k != "name")
    steps = facts.splits.get("train", 0) // gb
    lr = scaled_lr(o.lr, gb, o.lr_scaling, o.reference_batch)
    how = {"none": "optim.lr (lr_scaling none)",
           "linear": f"optim.lr {o.lr:g} × {gb}/{o.reference_batch} (lr_scaling linear)",
           "sqrt": f"optim.lr {o.lr:g} × sqrt({gb}/{o.reference_batch}) (lr_scaling sqrt)",
           }.get(o.lr_scaling, o.lr_scaling)
    knn = (f"every {cfg.knn.every_epochs} epochs (k {cfg.knn.k}, {cfg.knn.query_split} vs "
           f"{cfg.knn.bank_split})" if facts.knn
           else f"off ({facts.knn_note or 'knn.every_epochs 0'})")
    return "\n".join([
        f"simgraph pretrain: run {cfg.name!r} -> {run_dir}",
        f"  data    {display(d.dataset)}: {splits}; {facts.num_classes} classes{caps}",
        f"  loss    {cfg.loss.name} ({loss})" if loss else f"  loss    {cfg.loss.name}",
        f"  model   {cfg.model.backbone}, projector {cfg.model.projector_hidden}->"
        f"{cfg.model.projector_dim}",
        *([f"  init    {facts.init['summary']}"] if getattr(facts, "init", None) else []),
        f"  batch   {w} worker(s) x {d.batch_size} = {gb} global, {d.views} "
        f"view{'' if d.views == 1 else 's'}"
        + (" (" + " + ".join(f"{n} x {a.resolution} px" for n, a in d.groups()) + ")"
           if d.view_groups else "") + "; "
        f"{steps} steps/epoch x {cfg.train.epochs} epochs = {steps * cfg.train.epochs} steps"
        + (f"; encoder in {k} chunks of {d.batch_size // k} (train.accumulate)"
           if (k := cfg.train.accumulate) > 1 else ""),
        f"  optim   {o.name}, peak LR {lr:.4g} = {how}; warm-up {o.warmup_epochs:g} epochs, "
        f"then {o.schedule}" + (f" to {o.final_lr_fraction:g} x peak"
                                if o.schedule == "cosine" else
                                f" x {o.step_gamma:g} at epochs "
                                f"{', '.join(f'{x:g}' for x in o.step_epochs)}"
                                if o.schedule == "step" else ""),
        f"  kNN     {knn}",
        *([f"  probe   every {pb.every_epochs} epochs (linear on the backbone features, AdamW "
           f"lr {pb.lr:g}, weight decay {pb.weight_decay:g}; top-1 on {pb.split_of(cfg.knn)})"]
          if (pb := cfg.probe).every_epochs else []),
        *([p] if (p := _precision(cfg)) else []),
        *(f"  warning {note}" for note in facts.warnings),
    ])


def _precision(cfg: Any) -> str | None:
    """The summary's precision line when it is not plain float32 eager: ``train.amp`` (what
    ``auto`` becomes: on CPU, this machine's answer — each worker decides for its own
    device) and ``train.compile``."""
    t = cfg.train
    if t.amp == "none" and not t.compile:
        return None
    amp = t.amp
    if amp == "auto":
        if cfg.scaling.use_gpu:
            amp = "auto (bf16 on GPUs of compute capability >= 8.0, else float32; per worker)"
        else:
            import torch

            from components.training.step import resolve_amp

            got = resolve_amp("auto", torch.device("cpu"))
            amp = f"auto -> {'float32' if got == 'none' else got} on this machine's CPU"
    return f"  precision train.amp {amp}" + ("; train.compile on" if t.compile else "")

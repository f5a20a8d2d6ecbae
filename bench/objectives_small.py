"""Small-batch objective cost against the fastest peers, side by side in one run.

Our SimCLR / SupCon against formula-level re-implementations (written here from the papers'
public code, not copied) of

* HobbitLong/SupContrast ``losses.py`` ``SupConLoss`` (contrast_mode='all'): features
  [B, V, D] → view-major rows; ``logits = a·cᵀ/τ`` minus the detached row max, a float
  ``logits_mask`` removing self, ``log_prob = logits − log Σ exp(logits)·mask``, mean of
  ``log_prob`` over positives, ``loss = −(τ/base_τ)·mean`` (base_τ = τ here, so the factor
  is 1). With labels it is our SupCon L_out; without, our SimCLR;
* vturrisi/solo-learn ``solo/losses/simclr.py`` ``simclr_loss_func``: ``sim = exp(a·aᵀ/τ)``,
  bool positive mask (same index, diagonal cleared) and negative mask (other index),
  ``−mean log(pos / (pos + neg))``. With sample indexes it is our SimCLR; with labels as the
  indexes (solo-learn's supervised mode) it is our SupCon L_in minus ``mean log|P(i)|``.

Both peers get un-normalised ``z`` and normalise it first, as our objectives do inside, and
use the peer's own row order (view-major); before timing, each peer's value is checked
against ours on the same input (float32, rtol 1e-5), so the ratios compare like with like.

Ours runs two ways: "ours" as a plain call (the batch reads its own input checks back), and
"ours (step)" as training's step calls it (``components/training/step.py`` ``train_step``): inside
``hot_path(equal_batches=True)`` with the dataset's sample ids, so the batch's checks ride on
the loss statistics' one read.

Times: forward + backward, medians of ``--repeats`` interleaved repeats (every case once per
round, so drift hits all alike; in a shuffled order each round, since a case timed right
after its own twin runs ~5 % faster on warm caches), one intra-op thread by default
(``--threads``): on a shared 2-core machine that gives every case the same resources.
``--baseline REV`` also times our objectives as of git revision REV (its ``components/`` is
extracted to a temporary directory and imported under its own module objects), interleaved
with the current ones: a before/after measured in one run.

Usage: ``python bench/objectives_small.py [--sizes 256 512 1024 4096] [--repeats 41]
[--classes 100] [--baseline HEAD~1]``
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import importlib
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor

import components.objectives as current

D, CLASSES, TAU = 128, 100, 0.1
REPO = Path(__file__).resolve().parents[1]


def hobbitlong_supcon(z: Tensor, labels: Tensor | None, tau: float = TAU,
                      base_tau: float = TAU) -> Tensor:
    """HobbitLong/SupContrast ``SupConLoss`` (contrast_mode='all'), formula by formula."""
    features = F.normalize(z, dim=-1)  # their encoders normalise before the loss
    b, v, _ = features.shape
    if labels is None:  # SimCLR mode: only the other views of the same sample
        mask = torch.eye(b, dtype=torch.float32, device=z.device)
    else:
        mask = torch.eq(labels[:, None], labels[None, :]).float()
    contrast = torch.cat(torch.unbind(features, dim=1), dim=0)  # [V·B, D], view-major
    anchor_dot_contrast = contrast @ contrast.T / tau
    logits_max, _ = anchor_dot_contrast.max(dim=1, keepdim=True)
    logits = anchor_dot_contrast - logits_max.detach()
    mask = mask.repeat(v, v)
    logits_mask = torch.scatter(torch.ones_like(mask), 1,
                                torch.arange(b * v, device=z.device)[:, None], 0)
    mask = mask * logits_mask
    exp_logits = torch.exp(logits) * logits_mask
    log_prob = logits - torch.log(exp_logits.sum(1, keepdim=True) + 1e-9)
    mean_log_prob_pos = (mask * log_prob).sum(1) / mask.sum(1)
    return (-(tau / base_tau) * mean_log_prob_pos).mean()


def solo_learn_simclr(z: Tensor, indexes: Tensor, tau: float = TAU) -> Tensor:
    """vturrisi/solo-learn ``simclr_loss_func`` (single process), formula by formula.

    ``indexes`` [B]: sample ids (SimCLR) or labels (their supervised mode)."""
    b, v, _ = z.shape
    a = F.normalize(z.transpose(0, 1).flatten(0, 1), dim=-1)  # [V·B, D], view-major
    sim = torch.exp(a @ a.T / tau)
    idx = indexes.repeat(v)[None, :]
    pos_mask = idx.T == idx
    pos_mask.fill_diagonal_(False)
    neg_mask = idx.T != idx
    pos = (sim * pos_mask).sum(1)
    neg = (sim * neg_mask).sum(1)
    return -torch.log(pos / (pos + neg)).mean()


def load_objectives_at(rev: str, into: Path) -> ModuleType:
    """``components.objectives`` as of git ``rev``, imported next to the current one.

    Its ``components/`` tree is extracted under ``into``, and imported with the current
    ``components.*`` modules set aside, which are put back afterwards: the returned module's
    classes keep their own module globals, so both versions run in one process."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "components"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    ours = {k: m for k, m in sys.modules.items() if k == "components" or
            k.startswith("components.")}
    for k in ours:
        del sys.modules[k]
    sys.path.insert(0, str(into))
    try:
        return importlib.import_module("components.objectives")
    finally:
        sys.path.remove(str(into))
        for k in [k for k in sys.modules if k == "components" or k.startswith("components.")]:
            del sys.modules[k]
        sys.modules.update(ours)


Case = Callable[[Tensor], Tensor]


def make_cases(b: int, baseline: ModuleType | None, classes: int = CLASSES
               ) -> dict[str, dict[str, Case]]:
    """Per loss: {implementation: z [B, 2, D] -> scalar loss}; "ours" and "ours (step)" (and
    their "… before" with a baseline) plus the peers, each defined to equal ours."""
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, classes, (b,), generator=g)
    ids = torch.arange(b)
    sample_ids = torch.randperm(50 * b, generator=g)[:b]  # dataset-wide ids, as training's

    def ours(module: ModuleType, step: bool) -> dict[str, Case]:
        simclr, out, inn = (module.InfoNCE(TAU), module.SupCon(TAU, variant="out"),
                            module.SupCon(TAU, variant="in"))
        batch = module.ContrastiveBatch
        # training's step: hot_path(equal_batches=True), sample ids in every batch
        # (the module's own hot_path: a baseline's is not in sys.modules; in batch.py since
        # issue 41, in core.py before)
        home = getattr(module, "batch", None) or module.core
        context = (functools.partial(home.hot_path, equal_batches=True) if step
                   else contextlib.nullcontext)
        extra = {"sample_ids": sample_ids} if step else {}

        def call(objective: Callable[..., tuple[Tensor, object]], **fields: Tensor) -> Case:
            def run(z: Tensor) -> Tensor:
                with context():
                    return objective(batch(z=z, **fields, **extra))[0]
            return run

        return {"simclr": call(simclr), "supcon_out": call(out, labels=labels),
                "supcon_in": call(inn, labels=labels)}

    variants = {"ours": ours(current, False), "ours (step)": ours(current, True)}
    if baseline is not None:
        variants |= {"ours before": ours(baseline, False),
                     "ours (step) before": ours(baseline, True)}
    # solo-learn's supervised mode lacks SupCon L_in's 1/|P(i)|: ours = solo + mean log|P(i)|.
    per_view = labels.repeat_interleave(2)
    log_p = torch.log(((per_view[:, None] == per_view[None, :]).sum(1) - 1).float()).mean()
    cases: dict[str, dict[str, Case]] = {
        "simclr": {"solo-learn": lambda z: solo_learn_simclr(z, ids),
                   "HobbitLong": lambda z: hobbitlong_supcon(z, None)},
        "supcon_out": {"HobbitLong": lambda z: hobbitlong_supcon(z, labels)},
        "supcon_in": {"solo-learn (sup.)": lambda z: solo_learn_simclr(z, labels) + log_p},
    }
    for loss, peers in cases.items():
        for name, losses in variants.items():
            peers[name] = losses[loss]
    return cases


def timed(fn: Case, z: Tensor) -> float:
    start = time.perf_counter()
    fn(z).backward()
    elapsed = time.perf_counter() - start
    z.grad = None
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 4096],
                        help="2B: rows = B samples × 2 views")
    parser.add_argument("--repeats", type=int, default=41,
                        help="interleaved rounds at 2B <= 1024 (a quarter of them above)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--classes", type=int, default=CLASSES,
                        help="label classes (SupCon's positives: about 2B/classes per anchor)")
    parser.add_argument("--baseline", default=None,
                        help="git revision whose objectives are timed too, interleaved")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# bench/objectives_small.py — {datetime.date.today()} — {platform.node()} — "
          f"cpu ({torch.get_num_threads()} thread(s)) — torch {torch.__version__}"
          + f" — {args.classes} classes"
          + (f" — baseline {args.baseline}" if args.baseline else ""))
    with tempfile.TemporaryDirectory() as tmp:
        baseline = load_objectives_at(args.baseline, Path(tmp)) if args.baseline else None
        for rows in args.sizes:
            run_size(rows, args.repeats if rows <= 1024 else max(5, args.repeats // 4),
                     baseline, args.classes)


def run_size(rows: int, repeats: int, baseline: ModuleType | None, classes: int) -> None:
    b = rows // 2
    z = torch.randn(b, 2, D, generator=torch.Generator().manual_seed(1)).requires_grad_()
    cases = make_cases(b, baseline, classes)
    flat = {(loss, name): fn for loss, peers in cases.items() for name, fn in peers.items()}
    with torch.no_grad():  # like for like: every case's value equals ours on this input
        for (loss, name), fn in flat.items():
            want, got = float(cases[loss]["ours"](z)), float(fn(z))
            assert abs(got - want) <= 1e-5 * abs(want), (rows, loss, name, got, want)
    for fn in flat.values():  # warm-up
        timed(fn, z)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in flat}
    order = list(flat)
    shuffle = random.Random(rows).shuffle
    for _ in range(repeats):  # interleaved rounds, each in a fresh order: a case run right
        shuffle(order)  # after its twin (warm caches and branch predictors) gains ~5 %
        for key in order:
            times[key].append(timed(flat[key], z))
    med = {key: statistics.median(t) for key, t in times.items()}
    print(f"\n## 2B = {rows}, D = {D}, {classes} classes, {repeats} rounds\n")
    print("| loss | implementation | fwd+bwd ms | × fastest peer |")
    print("|---|---|---:|---:|")
    for loss, peers in cases.items():
        fastest = min(med[(loss, n)] for n in peers if not n.startswith("ours"))
        for name in peers:
            t = med[(loss, name)]
            print(f"| {loss} | {name} | {t * 1e3:.2f} | {t / fastest:.2f} |")


if __name__ == "__main__":
    main()

"""Where a small-data run's time goes, phase by phase, beside a plain PyTorch loop and a
compute-only loop (issue 33 item 1), measured side by side in one run.

Three ways to train the same model with the same objective and optimiser on the same
Fashion-MNIST images (the small-data recipe, ``pipelines/configs/pretrain/small_data.yaml``):

* **pipeline** — ``simgraph pretrain`` in a fresh process (the CLI, ``scaling.host: auto``:
  in-process for this one-worker CPU run), instrumented from outside: the recipe's methods,
  the reader's constructor, each batch wait and each ``train_step`` are wrapped with timers
  (nothing in the product changes). Phases: process start to the recipe's setup (Python,
  imports, config, dataset checks, run dir), setup (dataset, model, optimiser), the train
  loader's build, the first batch, the first step, the rest of epoch 1, the steady epochs,
  the online kNN, checkpoints, teardown.
* **plain** — ``bench/parity.py``'s loop: torchvision ``transforms.v2`` views in a
  ``DataLoader`` (no worker processes, as the parity bench), a hand-written step.
* **compute-only** — the product's ``train_step`` on in-memory tensors of the same shape: what
  the step alone can do on this CPU, with no reader beside it.

Steady state = epochs 2.. (images per second, one image = its ``views`` views; the kNN and
checkpoints are outside it). Printed: the pipeline's phases (median over ``--repeats``), then
every loop's steady images/s (median over epochs and repeats, [min, max]) and the ratios the
issue's goals name: pipeline / compute-only (goal ≥ 0.8), pipeline / plain (≥ 0.95), whole
run pipeline / plain (≤ 1.15; each in a fresh process, imports counted; the plain loop has no
kNN passes or checkpoints).

``--variant NAME=OVERRIDE,OVERRIDE`` adds pipeline runs with pretrain overrides (e.g.
``--variant workers2=data.num_workers=2``), each interleaved with the others.

    python bench/phases.py [--per-class 120] [--epochs 6] [--repeats 2] [--loss supcon]

Run it alone (the three loops share the machine's cores; a second job skews the ratios).
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import functools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIG = ROOT / "pipelines/configs/pretrain/small_data.yaml"
LOSSES = {"simclr": ["loss.name=simclr"], "supcon": ["loss.name=supcon"],
          "xclr": ["loss.name=xclr", "loss.graph=class", "loss.tau_s=0.1"]}

# ---------------------------------------------------------------------------------------------
# The pipeline, instrumented (the child process).

EVENTS: list[tuple[str, float, float]] = []  # (what, wall start, wall end), time.time()


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            EVENTS.append((name, t, time.time()))
    return wrapper


def child(config: str, events: str) -> None:
    """``simgraph pretrain config`` with timers around its phases; events to ``events``."""
    import components.runs.diagnostics as diagnostics
    import components.runs.worker as worker
    import components.training.step as training
    from components.data import reader

    R = worker.PretrainRecipe
    wrap: list[tuple[Any, str, str]] = [
        *((R, n, n) for n in ("setup", "train_epoch", "evaluate_epoch", "save", "cleanup")),
        (reader.ViewLoader, "__init__", "loader_build"), (diagnostics.DataWait, "next", "batch")]
    for owner, attr, label in wrap:
        setattr(owner, attr, _timed(label, getattr(owner, attr)))
    training.train_step = _timed("step", training.train_step)

    returned: list[float] = []

    def dump() -> None:
        Path(events).write_text(json.dumps({"events": EVENTS,
                                            "returned": returned[0]}))

    atexit.register(dump)
    from pipelines.cli import main

    code = main(["pretrain", config])
    returned.append(time.time())
    sys.exit(code)


def phases(start: float, end: float, log: dict[str, Any], batch: int) -> dict[str, Any]:
    """Seconds per phase and the steady epochs' images/s from one run's events."""
    ev = [(n, a, b) for n, a, b in log["events"]]

    def first(name: str) -> tuple[float, float]:
        return next((a, b) for n, a, b in ev if n == name)

    def total(name: str) -> float:
        return sum(b - a for n, a, b in ev if n == name)

    s0, s1 = first("setup")
    in_setup = sum(b - a for n, a, b in ev if n == "loader_build" and s0 <= a < s1)
    epochs = [(a, b) for n, a, b in ev if n == "train_epoch"]
    e0, e1 = epochs[0]
    b0, b1 = first("batch")
    t0, t1 = first("step")
    steps = [(a, b) for n, a, b in ev if n == "step"]
    per_epoch = len(steps) // len(epochs)
    out = {
        "start to setup (imports, config, checks)": s0 - start,
        "setup: dataset, model, optimiser": (s1 - s0) - in_setup,
        "setup: train loader build": in_setup,
        "first batch": b1 - b0,
        "first step": t1 - t0,
        "rest of epoch 1": (e1 - e0) - (b1 - b0) - (t1 - t0),
        "steady epochs": sum(b - a for a, b in epochs[1:]),
        "online kNN (incl. its loaders)": total("evaluate_epoch"),
        "checkpoints, metrics": total("save"),
        "after training (summary, run-dir lines)": log["returned"] - max(b for _, _, b in ev),
        "interpreter exit": end - log["returned"],
    }
    out["wall"] = end - start
    out["other"] = out["wall"] - sum(v for k, v in out.items() if k != "wall")
    rates = [per_epoch * batch / (b - a) for a, b in epochs[1:]]
    waits = [sum(b - a for n, a, b in ev if n == "batch" and ea <= a < eb) / (eb - ea)
             for ea, eb in epochs[1:]]
    return {"phases": out, "rates": rates, "wait": statistics.median(waits)}


def _write_config(cfg: Any, work: Path, name: str) -> Path:
    import yaml

    from components.config import to_dict

    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    return path


def run_pipeline(cfg: Any, work: Path, name: str) -> dict[str, Any]:
    shutil.rmtree(Path(cfg.storage) / cfg.name, ignore_errors=True)  # a fresh run, no resume
    path = _write_config(cfg, work, name)
    events = work / f"{name}.events.json"
    start = time.time()
    subprocess.run([sys.executable, __file__, "--child", str(path), str(events)], cwd=ROOT,
                   check=True, capture_output=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    end = time.time()
    return phases(start, end, json.loads(events.read_text()), cfg.data.batch_size)


# ---------------------------------------------------------------------------------------------
# The plain loop and the compute-only loop (this process).


def plain_child(config: str, out: str) -> None:
    """The parity bench's plain loop on ``config`` (a pretrain config), timed per epoch:
    images/s of each epoch to ``out``."""
    import torch
    from parity import Views, plain_step, plain_transform, read_split

    from components.config import PretrainConfig, load_config
    from components.data.reader import DatasetInfo
    from components.training.optim import build_for_run
    from components.training.step import build_model

    cfg = load_config(config, PretrainConfig)
    torch.set_num_threads(max(1, int(cfg.scaling.cpus_per_worker)))
    info = DatasetInfo.load(cfg.data.dataset)
    sim_np = info.class_similarity()
    sim = None if sim_np is None else torch.as_tensor(sim_np, dtype=torch.float32)
    classes, caption_dim = len(info.classes), info.caption_dim
    torch.manual_seed(cfg.train.seed)
    model, ema = build_model(cfg.model, cfg.loss, classes, sim, caption_dim,
                             cfg.data.augment.resolution)
    data = Views(read_split(info.split_file("train")),
                 plain_transform(cfg.data.augment, True), cfg.data.views)
    loader = torch.utils.data.DataLoader(data, batch_size=cfg.data.batch_size, shuffle=True,
                                         drop_last=True)
    opt, sched = build_for_run(model, cfg.optim, cfg.data.batch_size, len(loader),
                               cfg.train.epochs)
    model.train()
    rates = []
    for _ in range(cfg.train.epochs):
        t0 = time.perf_counter()
        for x, y, ids, caps in loader:
            opt.zero_grad(set_to_none=True)
            loss, _ = plain_step(model, ema, x, y, ids, caps if caps.numel() else None)
            loss.backward()
            opt.step()
            sched.step()
        rates.append(len(loader) * cfg.data.batch_size / (time.perf_counter() - t0))
    Path(out).write_text(json.dumps(rates))


def run_plain(cfg: Any, work: Path) -> tuple[list[float], float]:
    """The plain loop in a fresh process (imports counted, as the pipeline's): images/s per
    epoch, wall s."""
    path, out = _write_config(cfg, work, "plain"), work / "plain.rates.json"
    start = time.time()
    subprocess.run([sys.executable, __file__, "--plain", str(path), str(out)], cwd=ROOT,
                   check=True, capture_output=True)
    return json.loads(out.read_text()), time.time() - start


def compute_epochs(cfg: Any, images: int, classes: int, sim: Any, caption_dim: int,
                   ) -> list[float]:
    """The product's ``train_step`` on in-memory batches of the run's shape: images/s per
    epoch (as many steps per epoch as the pipeline's)."""
    import torch

    from components.data.reader import Batch
    from components.training.optim import build_for_run
    from components.training.step import build_model, train_step

    torch.manual_seed(cfg.train.seed)
    model, ema = build_model(cfg.model, cfg.loss, classes, sim, caption_dim,
                             cfg.data.augment.resolution)
    b, v, r = cfg.data.batch_size, cfg.data.views, cfg.data.augment.resolution
    steps = images // b
    gen = torch.Generator().manual_seed(0)
    batches = [Batch(images=torch.randn(b, v, 3, r, r, generator=gen),
                     labels=torch.randint(0, classes, (b,), generator=gen),
                     sample_ids=torch.arange(i * b, (i + 1) * b),
                     captions=(torch.nn.functional.normalize(
                         torch.randn(b, caption_dim, generator=gen), dim=1)
                         if caption_dim else None))
               for i in range(min(steps, 4))]
    opt, sched = build_for_run(model, cfg.optim, b, steps, cfg.train.epochs)
    device = torch.device("cpu")
    model.train()
    rates, step = [], 0
    for _ in range(cfg.train.epochs):
        t0 = time.perf_counter()
        for i in range(steps):
            train_step(model, ema, opt, sched, None, batches[i % len(batches)],
                       train_cfg=cfg.train, device=device, step=step,
                       total_steps=steps * cfg.train.epochs, ema_momentum=0.996, where="bench")
            step += 1
        rates.append(steps * b / (time.perf_counter() - t0))
    return rates


# ---------------------------------------------------------------------------------------------


def _med(xs: Sequence[float]) -> str:
    return f"{statistics.median(xs):.0f} [{min(xs):.0f}, {max(xs):.0f}]"


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) == 4 and sys.argv[1] == "--plain":
        plain_child(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-class", type=int, default=120,
                    help="Fashion-MNIST images per class and official split")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--loss", choices=list(LOSSES), default="supcon")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=OVERRIDE[,OVERRIDE...]: another pipeline run per repeat")
    ap.add_argument("--dataset", default=None,
                    help="an existing dataset dir to train on instead (nothing is built)")
    ap.add_argument("--work", default="runs/phases")
    args = ap.parse_args()

    import torch

    from components.config import PreprocessConfig, PretrainConfig, load_config
    from components.data.reader import DatasetInfo
    from components.runtime.session import ray_session
    from pipelines import preprocess

    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    dataset = Path(args.dataset).resolve() if args.dataset else work / "fmnist"
    if not args.dataset:
        pre = load_config(ROOT / "pipelines/configs/data/demo.yaml", PreprocessConfig, [
            f"output={dataset}", f"source.max_per_class={args.per_class}"])
        with ray_session(None):
            preprocess.run(pre, echo=False)
    info = DatasetInfo.load(dataset)
    sim_np = info.class_similarity()
    sim = None if sim_np is None else torch.as_tensor(sim_np, dtype=torch.float32)
    classes, n_train = len(info.classes), info.splits["train"]
    variants: dict[str, list[str]] = {"default": []}
    for v in args.variant:
        name, _, over = v.partition("=")
        variants[name] = [o for o in over.split(",") if o]
    base = [f"storage={work / 'runs'}", f"data.dataset={dataset}",
            f"train.epochs={args.epochs}", *LOSSES[args.loss]]
    cfg = load_config(CONFIG, PretrainConfig, [*base, "name=plain"])
    torch.set_num_threads(max(1, int(cfg.scaling.cpus_per_worker)))  # as the recipe does
    compute: list[float] = []
    plain: list[float] = []
    plain_wall: list[float] = []
    piped: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
    t_all = time.perf_counter()
    for r in range(args.repeats):  # interleaved: the machine's noise hits every loop alike
        compute += compute_epochs(cfg, n_train, classes, sim, info.caption_dim)[1:]
        rates, wall = run_plain(cfg, work)
        plain += rates[1:]
        plain_wall.append(wall)
        for name, over in variants.items():
            run = load_config(CONFIG, PretrainConfig, [*base, f"name={name}-r{r}", *over])
            got = run_pipeline(run, work, f"{name}-r{r}")
            piped[name].append(got)
            print(f"[phases] repeat {r}: {name} {statistics.median(got['rates']):.0f} img/s, "
                  f"compute-only {statistics.median(compute):.0f}, plain "
                  f"{statistics.median(plain):.0f}", flush=True)

    print(f"\n## Where a small-data run's time goes ({datetime.date.today()}, "
          f"{platform.machine()}, {os.cpu_count()} CPUs; {dataset.name}: {n_train} train images, "
          f"{args.loss}, batch {cfg.data.batch_size} × "
          f"{cfg.data.views} views, {args.epochs} epochs, {args.repeats} repeats interleaved; "
          f"{(time.perf_counter() - t_all) / 60:.1f} min)\n")
    names = list(variants)
    print("| phase, s (median over repeats) | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for key in piped["default"][0]["phases"]:
        cells = [f"{statistics.median(g['phases'][key] for g in piped[n]):.2f}" for n in names]
        print(f"| {key} | " + " | ".join(cells) + " |")
    print("\n| loop | steady images/s (median [min, max] over epochs 2..) | data-wait | "
          "÷ compute-only | ÷ plain |")
    print("|---|---:|---:|---:|---:|")
    c_med, p_med = statistics.median(compute), statistics.median(plain)
    print(f"| compute-only (`train_step`, in-memory tensors) | {_med(compute)} | — | 1.00 | "
          f"{c_med / p_med:.2f} |")
    print(f"| plain (torchvision, DataLoader) | {_med(plain)} | — | {p_med / c_med:.2f} | 1.00 |")
    for n in names:
        rates = [x for g in piped[n] for x in g["rates"]]
        m = statistics.median(rates)
        wait = statistics.median(g["wait"] for g in piped[n])
        print(f"| pipeline {n} | {_med(rates)} | {100 * wait:.1f} % | {m / c_med:.2f} | "
              f"{m / p_med:.2f} |")
    pw = statistics.median(plain_wall)
    print("\nWhole-run wall, pipeline ÷ plain (median): " + ", ".join(
        f"{n} {statistics.median(g['phases']['wall'] for g in piped[n]) / pw:.2f}"
        for n in names) + f" (plain {pw:.1f} s)")


if __name__ == "__main__":
    main()

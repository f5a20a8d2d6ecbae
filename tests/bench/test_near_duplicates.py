"""bench/near_duplicates.py on small sets: its copy of the replaced band scheme finds the same
pairs as components.data.hash_search.near_pairs, and it prints its table."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import near_duplicates  # noqa: E402

from components.data import hash_search  # noqa: E402


def test_the_baseline_finds_the_same_pairs() -> None:
    for h in (near_duplicates.uniform(3000), near_duplicates.clumpy(2000, 60)):
        for t in (0, 3, 6):
            old = near_duplicates.band_near_pairs(h, t)
            assert np.array_equal(old, hash_search.near_pairs(h, t)) and len(old), t


def test_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    near_duplicates.main(["--sizes", "2000", "4000", "--clumpy", "1000"])
    out = capsys.readouterr().out
    assert out.count(" yes |") == 3 and "NO" not in out and "per doubling" in out


def test_large_sizes_time_the_new_search_alone(capsys: pytest.CaptureFixture[str]) -> None:
    near_duplicates.main(["--sizes", "2000", "4000", "--clumpy", "0", "--bands-up-to", "2000"])
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| uniform")]
    assert len(rows) == 2 and " yes |" in rows[0] and rows[1].split(" | ")[2] == "—"

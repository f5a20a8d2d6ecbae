"""``simgraph inspect``: a report with its images for a small dataset dir (no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from components.data.inspection import run
from pipelines.cli import main as cli_main
from tests.support.datasets import synthetic_dataset


def test_inspect_writes_report_and_images(tmp_path: Path) -> None:
    root = synthetic_dataset(tmp_path / "ds", classes=3, train_per_class=10, val_per_class=2)
    m = json.loads((root / "manifest.json").read_text())
    m["skipped"] = {"total": 2, "by_reason": {"duplicate-of": 1, "corrupt-image": 1},
                    "items": [{"path": "/x/b.png", "reason": "duplicate-of",
                               "detail": "same bytes as /x/a.png", "of": "/x/a.png"},
                              {"path": "/x/validation/data-00000-of-00001.arrow#arrow:0:1:"
                                       "image", "reason": "corrupt-image",
                               "detail": "cannot decode"}]}
    # sample ids 0 and 1 are train images of class 0 (tests/support/datasets.py numbering)
    m["near_duplicates"] = {
        "threshold_bits": 6, "max_diff": 4.0, "pairs": 1, "groups": 1, "items": 2,
        "sizes": {"2": 1}, "straddling_splits": {"pairs": 0, "examples": []}, "listed": 1,
        "list": [[{"sample_id": 0, "path": "/x/a.png", "split": "train"},
                  {"sample_id": 1, "path": "/x/d.png", "split": "train"}]]}
    (root / "manifest.json").write_text(json.dumps(m))

    report = run(str(root), per_class=4)
    assert report == root / "inspect" / "report.md"
    text = report.read_text()
    for png in ("samples.png", "class_counts.png", "class_similarity.png",
                "near_duplicates.png"):
        assert f"({png})" in text, png
        img = np.asarray(Image.open(root / "inspect" / png))
        assert img.shape[0] > 50 and img.std() > 0, png  # a real, non-blank picture
    assert "| class0 | 10 | 2 |" in text  # counts per split, from the labels column
    assert "| /x/b.png | /x/a.png |" in text  # the dropped copy and the one it duplicates
    assert "| duplicate-of | 1 |" in text and "| corrupt-image | 1 |" in text
    # an example names its folder too: a DatasetDict's splits have the same file names
    assert "validation/data-00000-of-00001.arrow#arrow:0:1:image: cannot decode" in text
    assert "Near-duplicate groups:** 1 holding 2 images" in text
    assert "No caption texts" in text  # this synthetic dir has embeddings but no texts

    # The CLI: --out elsewhere; a dir without a manifest is refused with a message.
    assert cli_main(["inspect", str(root), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.md").exists()
    assert cli_main(["inspect", str(tmp_path / "nothing")]) == 1

"""What a run says of a dataset without labels before it starts (``check_dataset``), and what
``preprocess`` prints of one: the cause (no labels) and a fix that addresses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.config import PretrainConfig, from_dict
from components.data.build.manifest import summary
from components.runs.dataset_checks import check_dataset
from components.runs.errors import RunError
from tests.support.datasets import synthetic_dataset, tiny_run_config


def _unlabelled(root: Path) -> Path:
    synthetic_dataset(root)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["classes"], manifest["class_files"] = [], {}  # as an unlabelled build writes it
    (root / "manifest.json").write_text(json.dumps(manifest))
    (root / "class_similarity.npy").unlink()
    return root


def test_an_unlabelled_dataset_names_the_cause_and_its_fix(tmp_path: Path) -> None:
    root = _unlabelled(tmp_path / "ds")

    def cfg(**loss: object) -> PretrainConfig:
        return from_dict(PretrainConfig, tiny_run_config(root, tmp_path / "runs", loss=loss))

    # X-CLR's class graph: was "X-CLR graph='class' needs class_similarity, a [C, C] matrix"
    with pytest.raises(RunError, match=r"graph='class' needs labels but .* has none .*use "
                                       r"loss.graph=caption"):
        check_dataset(cfg(name="xclr", tau=0.1, tau_s=0.1, graph="class"))
    # the online kNN off for want of labels: the fix is labels (was "split.val > 0", while
    # val held images)
    facts = check_dataset(cfg(name="simclr", tau=0.2))
    (warning,) = [w for w in facts.warnings if "online kNN is off" in w]
    assert "(no labels)" in warning and "preprocess with labels" in warning
    assert "split.val" not in warning


def test_the_build_summary_counts_classes_not_the_unlabelled_bucket() -> None:
    text = summary({"splits": {"train": {"samples": 60, "per_class": {"unlabelled": 60}},
                               "val": {"samples": 5, "per_class": {"a": 3, "b": 2}}},
                    "skipped": {"total": 0, "by_reason": {}}})
    assert "train           60  0" in text and "val              5  2" in text

"""``simgraph evaluate``: reports render with every plot, several runs compare, known-answer
metrics through the same functions, and each bad input is a clear error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from components.data.reader import set_jit
from components.evaluation.graph import graph_metrics, target_noise_separation
from components.evaluation.knn import knn_top1
from components.evaluation.probe import linear_probe
from pipelines.evaluate import EvaluateError, evaluate_run, load_run, main, paired_differences
from tests.datasets import run_with_checkpoint, synthetic_dataset


@pytest.fixture(autouse=True)
def _no_jit() -> Any:
    set_jit(False)
    yield
    set_jit(True)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_dataset(tmp_path_factory.mktemp("eval") / "ds")


def _run(dataset: Path, storage: Path, name: str, **over: Any) -> Path:
    """A run dir with one checkpoint, as `simgraph pretrain` leaves it (no Ray needed)."""
    return run_with_checkpoint(dataset, storage, name, **over)


def test_report_and_comparison_render(dataset: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    a = _run(dataset, tmp_path, "a")
    b = _run(dataset, tmp_path, "b", loss={"name": "xclr", "tau_s": 0.2})
    assert main([str(a), str(b)]) == 0
    for run in (a, b):
        out = run / "eval"
        for f in ("report.md", "metrics.json", "knn_vs_k.png", "separation.png",
                  "class_similarity.png"):
            assert (out / f).stat().st_size > 0, f
        m = json.loads((out / "metrics.json").read_text())
        assert set(m["knn"]) == {"1", "5", "10", "20", "50", "100"}  # 128 train images
        assert all(0 <= v["top1"] <= v["top5"] <= 1 for v in m["knn"].values())
        # what the files say is what evaluation computes (deterministic: same numbers again)
        again = evaluate_run(run)
        assert {k: v["top1"] for k, v in m["knn"].items()} == pytest.approx(
            {str(k): v["top1"] for k, v in again.knn.items()}, abs=1e-9)
        assert m["probe"]["top1"] == pytest.approx(again.probe["top1"], abs=1e-9)
        assert m["separation"]["margin"] == pytest.approx(again.separation["margin"], abs=1e-6)
        assert m["graph"]["label_error"] == pytest.approx(again.graph["label_error"], abs=1e-9)
        report = (out / "report.md").read_text()
        for k in (1, 20):
            v = again.knn[k]
            assert f"| {k} | {100 * v['top1']:.1f} | {100 * v['top5']:.1f} |" in report, k
        # every reported accuracy carries its interval, over the query images
        iv = m["intervals"]
        assert set(iv) == {"knn@1", "knn@5", "knn@10", "knn@20", "knn@50", "knn@100",
                           "probe", "margin"}
        for key, value in (("knn@20", again.knn[20]["top1"]), ("probe", again.probe["top1"]),
                           ("margin", again.separation["margin"])):
            assert iv[key]["low"] <= iv[key]["value"] <= iv[key]["high"], key
            assert iv[key]["value"] == pytest.approx(value, abs=1e-6), key
        assert "32 query images" in m["interval_method"]
        assert "kNN@20 top-1 % | probe top-1 % | margin |" in report
    comp = (tmp_path / "comparison" / "comparison.md").read_text()
    assert "| a | supcon | tau=0.2, variant=out, bank_size=40 | 1 |" in comp
    assert "| b | xclr | tau=0.1, tau_s=0.2, graph=class" in comp
    assert "Δ kNN@20 vs a" in comp and "differences are paired" in comp
    pairs = json.loads((tmp_path / "comparison" / "comparison.json").read_text())
    d = pairs[1]["paired_difference"]
    assert pairs[1]["paired_difference_vs"] == "a"
    ea, eb = evaluate_run(a), evaluate_run(b)
    assert d["knn@20"]["value"] == pytest.approx(eb.knn[20]["top1"] - ea.knn[20]["top1"])
    assert (tmp_path / "comparison" / "knn_vs_k.png").exists()
    assert "kNN@1" in capsys.readouterr().out
    # the same run against itself: a paired difference of exactly 0
    same = paired_differences(ea, evaluate_run(a))
    assert same is not None and all((v.value, v.low, v.high) == (0.0, 0.0, 0.0)
                                    for v in same.values())


def test_projector_features(dataset: Path, tmp_path: Path) -> None:
    e = evaluate_run(_run(dataset, tmp_path, "p"), projector=True, probe_epochs=20)
    assert e.feature == "projector" and e.learned_similarity.shape == (4, 4)


def test_known_structure_through_the_metrics() -> None:
    """Separated clusters: kNN = probe = 100 %, exact separation margin, no label error."""
    g = torch.Generator().manual_seed(0)
    centres = torch.eye(4, 8)
    y = torch.arange(4).repeat_interleave(20)
    x = centres[y] + 0.01 * torch.randn(80, 8, generator=g)
    q = centres[y] + 0.01 * torch.randn(80, 8, generator=g)
    assert knn_top1(x, y, q, y, k=10, num_classes=4) == 1.0
    assert linear_probe(x, y, q, y, 4, epochs=50).top1 == 1.0
    sep = target_noise_separation(x, y, q, y)
    unit = torch.nn.functional.normalize
    best_same = (unit(q, dim=1) @ unit(x, dim=1).T).masked_fill(y[:, None] != y[None], -2)
    assert sep.target_median == pytest.approx(float(best_same.max(1).values.median()), abs=1e-3)
    assert sep.overlap == 0.0 and sep.margin > 0.9
    assert graph_metrics(q, y, k=5) == {"label_error": 0.0, "intra_class_connectivity": 1.0}
    shuffled = y[torch.randperm(80, generator=g)]
    assert knn_top1(x, shuffled, q, y, k=10, num_classes=4) < 0.6


def test_bad_inputs_are_clear_errors(dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(EvaluateError, match="not a run dir"):
        load_run(tmp_path)
    run = _run(dataset, tmp_path, "r")
    empty = tmp_path / "empty"
    shutil.copytree(run, empty)
    shutil.rmtree(empty / "epoch_00001")
    with pytest.raises(EvaluateError, match="no complete checkpoint"):
        load_run(empty)
    other = _run(dataset, tmp_path / "o", "r", optim__lr=0.9)
    with pytest.raises(EvaluateError, match=r"another config .*optim\.lr"):
        load_run(run, other / "epoch_00001")
    # a dataset dir with other content under the same path
    moved = tmp_path / "ds2"
    shutil.copytree(dataset, moved)
    run2 = _run(moved, tmp_path / "m", "m")
    manifest = json.loads((moved / "manifest.json").read_text())
    manifest["splits"]["train"]["sha256"] = "0" * 64
    (moved / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EvaluateError, match="does not hold the data this run trained on"):
        evaluate_run(run2)
    manifest["classes"] = []
    (moved / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EvaluateError, match="needs labelled data|has no labels"):
        evaluate_run(run2)


def test_labels_scores_against_groups_of_the_classes(dataset: Path, tmp_path: Path) -> None:
    """``--labels``: an identity map changes nothing, a two-group map writes its own report;
    a map that does not fit is a clear error."""
    run = _run(dataset, tmp_path, "g")
    plain = evaluate_run(run, probe_epochs=20)
    same = tmp_path / "same.yaml"
    same.write_text("".join(f"class{c}: class{c}\n" for c in range(4)))
    e = evaluate_run(run, probe_epochs=20, labels=same)
    assert e.knn == plain.knn and e.probe == plain.probe and e.classes == plain.classes
    one = tmp_path / "one.yaml"
    one.write_text("".join(f"class{c}: all\n" for c in range(4)))
    with pytest.raises(EvaluateError, match=r"every class in \['all'\].*at least 2 groups"):
        evaluate_run(run, labels=one)
    parity = tmp_path / "parity.yaml"
    parity.write_text("class0: even\nclass1: odd\nclass2: even\nclass3: odd\n")
    e = evaluate_run(run, probe_epochs=20, labels=parity)
    assert e.classes == ["even", "odd"] and e.target_similarity is None
    assert e.learned_similarity.shape == (2, 2) and 0.5 <= e.knn[20]["top1"] <= 1
    from pipelines.cli import main as cli

    assert cli(["evaluate", str(run), "--labels", str(parity)]) == 0
    m = json.loads((run / "eval-parity" / "metrics.json").read_text())
    assert m["labels"] == str(parity) and 0 <= m["knn"]["20"]["top1"] <= 1
    assert "the groups of" in (run / "eval-parity" / "report.md").read_text()
    assert not (run / "eval").exists()  # the class-level report is not overwritten
    bad = tmp_path / "bad.yaml"
    bad.write_text("class0: a\nclass1: b\nclass2: a\n")
    with pytest.raises(EvaluateError, match=r"no group for 1 classes: \['class3'\]"):
        evaluate_run(run, labels=bad)
    bad.write_text("class0: a\nclass1: b\nclass2: a\nclass3: b\ncat: a\n")
    with pytest.raises(EvaluateError, match=r"names \['cat'\] which are not classes"):
        evaluate_run(run, labels=bad)
    bad.write_text("- class0\n")
    with pytest.raises(EvaluateError, match="must be a mapping"):
        evaluate_run(run, labels=bad)


def test_fashion_mnist_coarse_map_covers_every_class() -> None:
    from components.data.sources import FASHION_MNIST_CLASSES
    from components.evaluation.labels import load_label_map

    root = Path(__file__).resolve().parents[1]
    groups, index = load_label_map(root / "pipelines/configs/labels/fashion_mnist_coarse.yaml",
                                   FASHION_MNIST_CLASSES)
    assert groups == ["bags", "bottoms", "shoes", "tops"]
    assert [groups[i] for i in index] == ["tops", "bottoms", "tops", "tops", "tops", "shoes",
                                          "tops", "shoes", "bags", "shoes"]

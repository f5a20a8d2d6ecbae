"""``simgraph evaluate``: reports render with every plot, several runs compare, known-answer
metrics through the same functions, and each bad input is a clear error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from components.evaluation.graph import graph_metrics, target_noise_separation
from components.evaluation.knn import knn_top1
from components.evaluation.probe import linear_probe
from components.evaluation.run_eval import paired_differences
from components.runs.evaluate import evaluate_run
from components.runs.scoring import EvaluateError, load_run
from pipelines.evaluate import main
from tests.support.datasets import run_with_checkpoint, synthetic_dataset

pytestmark = pytest.mark.usefixtures("no_jit")


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
                  "class_similarity.png", "embedding_map.png", "embedding_map.csv",
                  "neighbours.png"):
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
    # one random-init row: both runs share the model section and seed, so the same encoder
    assert comp.count("| random init | — | seed=0 | 0 |") == 1
    assert "gain kNN@20 vs random init" in comp
    pairs = json.loads((tmp_path / "comparison" / "comparison.json").read_text())
    d = pairs[1]["paired_difference"]
    assert pairs[1]["paired_difference_vs"] == "a"
    assert all(p["baseline"]["k"] == 20 for p in pairs)
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
    other = _run(dataset, tmp_path / "o", "r", optim__momentum=0.5)
    with pytest.raises(EvaluateError, match=r"another config .*optim\.momentum"):
        load_run(run, other / "epoch_00001")
    # a dataset dir with other content under the same path
    moved = tmp_path / "ds2"
    shutil.copytree(dataset, moved)
    run2 = _run(moved, tmp_path / "m", "m")
    manifest = json.loads((moved / "manifest.json").read_text())
    manifest["splits"]["train"]["sha256"] = "0" * 64
    (moved / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EvaluateError, match="does not hold the data this run trained on") as e:
        evaluate_run(run2)
    # what differs, where the run's config points, and a fix evaluate can take (it has no
    # data.dataset option: was "point data.dataset at the original dataset dir")
    assert "split files (train) differ" in str(e.value)
    assert f"data.dataset={str(moved)!r}" in str(e.value) and "restore" in str(e.value)
    assert "point data.dataset" not in str(e.value)
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
    # the map, the per-class table, the grid and the baseline score the groups too
    assert e.embedding_map is not None and set(e.embedding_map.labels.tolist()) == {0, 1}
    assert sorted((r.name, r.n) for r in e.per_class) == [("even", 16), ("odd", 16)]
    assert e.neighbours is not None and set(e.neighbours.query_labels.tolist()) == {0, 1}
    assert e.baseline is not None and "parity.yaml" in e.baseline.key
    from pipelines.cli import main as cli

    assert cli(["evaluate", str(run), "--labels", str(parity)]) == 0
    m = json.loads((run / "eval-parity" / "metrics.json").read_text())
    assert m["labels"] == str(parity) and 0 <= m["knn"]["20"]["top1"] <= 1
    assert "the groups of" in (run / "eval-parity" / "report.md").read_text()
    assert "coloured by group" in (run / "eval-parity" / "report.md").read_text()
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

    root = Path(__file__).resolve().parents[2]
    groups, index = load_label_map(root / "pipelines/configs/labels/fashion_mnist_coarse.yaml",
                                   FASHION_MNIST_CLASSES)
    assert groups == ["bags", "bottoms", "shoes", "tops"]
    assert [groups[i] for i in index] == ["tops", "bottoms", "tops", "tops", "tops", "shoes",
                                          "tops", "shoes", "bags", "shoes"]


# ---------------------------------------------------------------------------------------------
# What the report shows besides numbers: map, neighbours, per-class recall, random init.


def test_embedding_map_has_every_query_image_or_a_stratified_cap(dataset: Path,
                                                                  tmp_path: Path) -> None:
    """The report's map: one point per query image (32 < the cap), every class on it; a
    split larger than the cap: exactly ``cap`` points, each class in proportion and present,
    the same subsample every time (PCA first for wide features)."""
    import csv

    from components.evaluation.report import write_report
    from components.evaluation.visuals import MAP_POINTS, embedding_map, write_map_csv

    e = evaluate_run(_run(dataset, tmp_path, "m"), probe_epochs=20)
    write_report(e)
    out = tmp_path / "m" / "eval"
    rows = list(csv.DictReader((out / "embedding_map.csv").open()))
    assert len(rows) == min(32, MAP_POINTS) == len(e.query_labels)
    assert sorted(int(r["index"]) for r in rows) == list(range(32))
    assert {r["class"] for r in rows} == {"class0", "class1", "class2", "class3"}
    for r in rows:  # each point carries its own image's label
        assert int(r["label"]) == e.query_labels[int(r["index"])]
    assert (out / "embedding_map.png").stat().st_size > 0
    assert json.loads((out / "metrics.json").read_text())["embedding_map"]["points"] == 32

    g = torch.Generator().manual_seed(1)
    sizes = [100, 50, 20, 3, 1]  # imbalanced, with a class of one image
    y = torch.arange(5).repeat_interleave(torch.tensor(sizes))
    x = torch.randn(5, 64, generator=g)[y] + 0.3 * torch.randn(len(y), 64, generator=g)
    m = embedding_map(x, y, cap=60)
    assert len(m) == 60 and m.xy.shape == (60, 2) and m.total == 174 and m.pca_dims == 50
    counts = np.bincount(m.labels, minlength=5)
    assert counts.min() >= 1  # every class present, the 1-image one included
    assert abs(counts[0] - 60 * 100 / 174) <= 1 and abs(counts[1] - 60 * 50 / 174) <= 1
    assert np.array_equal(m.labels, y.numpy()[m.index])
    again = embedding_map(x, y, cap=60)
    assert np.array_equal(again.index, m.index) and np.allclose(again.xy, m.xy)
    write_map_csv(m, [f"c{i}" for i in range(5)], tmp_path / "map.csv")
    assert len((tmp_path / "map.csv").read_text().splitlines()) == 1 + 60


def test_neighbour_grid_marks_wrong_class_neighbours(tmp_path: Path) -> None:
    """Hand-made 2-D features: a class-0 query lying among class-1 bank images gets its four
    class-1 neighbours framed red and its class-0 one not; a class-2 query the reverse."""
    from components.evaluation.visuals import nearest_neighbours, plot_neighbours

    def unit(degrees: list[float]) -> torch.Tensor:
        a = torch.tensor(degrees) * torch.pi / 180
        return torch.stack([a.cos(), a.sin()], dim=1)

    bank = unit([0, 5, 10, 15, 85, 90, 95, 100, 175, 180, 185, 190])
    bank_y = torch.arange(3).repeat_interleave(4)
    query, query_y = unit([60, 182]), torch.tensor([0, 2])
    g = nearest_neighbours(bank, bank_y, query, query_y, [0, 1], k=5)
    assert g.neighbours.tolist() == [[4, 5, 6, 7, 3], [9, 10, 8, 11, 7]]
    expected = [[True, True, True, True, False], [False, False, False, False, True]]
    assert g.wrong.tolist() == expected
    rng = np.random.default_rng(0)
    g.query_images = rng.integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    g.neighbour_images = rng.integers(0, 256, (2, 5, 8, 8, 3), dtype=np.uint8)
    layout = plot_neighbours(g, ["cat", "dog", "fish"], tmp_path / "n.png", "test")
    assert (layout.rows, layout.cols, len(layout.tiles)) == (2, 6, 12)
    assert all(t.has_image for t in layout.tiles)
    assert [[layout.at(r, c + 1).marked_wrong for c in range(5)] for r in range(2)] == expected
    assert not layout.at(0, 0).marked_wrong and "query" in layout.at(0, 0).title
    assert layout.at(0, 0).title.endswith("cat") and layout.at(0, 1).title.startswith("dog")
    assert (tmp_path / "n.png").stat().st_size > 0


def test_neighbour_grid_of_a_run_shows_the_right_images(dataset: Path, tmp_path: Path) -> None:
    """8 queries spread over the 4 classes, 5 neighbours each (48 tiles); the images are the
    centre views of exactly those rows of the splits (compared with a full pass)."""
    from components.evaluation.visuals import centre_views, plot_neighbours, to_uint8
    from components.runs.scoring import eval_loader

    run = _run(dataset, tmp_path, "n")
    e = evaluate_run(run, probe_epochs=20, baseline=False)
    g = e.neighbours
    assert g is not None and g.neighbours.shape == (8, 5)
    assert np.bincount(g.query_labels, minlength=4).tolist() == [2, 2, 2, 2]
    assert np.array_equal(g.query_labels, e.query_labels[g.queries])
    cfg = load_run(run).config
    from components.data.reader import DatasetInfo

    info, a = DatasetInfo.load(dataset), cfg.data.augment
    for split, rows, images in (("train", g.neighbours, g.neighbour_images),
                                ("val", g.queries, g.query_images)):
        every = np.concatenate([to_uint8(b.images[:, 0], a.mean, a.std)
                                for b in eval_loader(cfg, info, split, "cpu")])
        assert images is not None and np.array_equal(images, every[rows]), split
    with pytest.raises(ValueError, match="past the end"):
        centre_views(eval_loader(cfg, info, "val", "cpu"), [3, 32], a.mean, a.std)
    layout = plot_neighbours(g, e.classes, tmp_path / "grid.png", "run")
    assert len(layout.tiles) == 8 * 6 and all(t.has_image for t in layout.tiles)
    assert sum(t.marked_wrong for t in layout.tiles) == int(g.wrong.sum())


def test_per_class_recall_is_the_mean_of_each_class_hits(dataset: Path, tmp_path: Path) -> None:
    from components.evaluation.report import write_report
    from components.evaluation.visuals import per_class_recall

    hits = np.array([1, 0, 1, 1, 0, 0, 1, 1, 1], dtype=bool)
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2])
    rows = per_class_recall(hits, labels, ["a", "b", "c", "d"])
    assert [(r.name, r.n) for r in rows] == [("b", 3), ("a", 4), ("c", 2), ("d", 0)]
    assert [r.recall.value for r in rows[:3]] == pytest.approx([1 / 3, 3 / 4, 1.0])
    for r in rows[:3]:
        assert r.recall.low <= r.recall.value <= r.recall.high
    with pytest.raises(ValueError, match="one entry per image"):
        per_class_recall(hits[:-1], labels, ["a", "b", "c"])

    e = evaluate_run(_run(dataset, tmp_path, "c"), probe_epochs=20, baseline=False)
    assert sorted(r.label for r in e.per_class) == [0, 1, 2, 3]
    for r in e.per_class:
        mine = e.knn_hits[20][e.query_labels == r.label]
        assert r.n == len(mine) == 8 and r.recall.value == pytest.approx(mine.mean())
    write_report(e)
    m = json.loads((tmp_path / "c" / "eval" / "metrics.json").read_text())["per_class_knn"]
    assert m["k"] == 20 and [c["class"] for c in m["classes"]] == [r.name for r in e.per_class]
    report = (tmp_path / "c" / "eval" / "report.md").read_text()
    assert "| class | val images | kNN@20 top-1 % [95 % CI] |" in report
    r = e.per_class[0]
    assert (f"| {r.name} | 8 | {100 * r.recall.value:.1f} [{100 * r.recall.low:.1f}, "
            f"{100 * r.recall.high:.1f}] |") in report


def test_random_init_baseline_row(dataset: Path, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The baseline is the run's config at its initial weights: the test checkpoints hold
    exactly the seed-0 initial weights, so a run of seed 0 gains exactly 0 over it, and a run
    of seed 1 is scored on the features of other weights. ``--no-baseline`` leaves it out
    everywhere."""
    from components.data.reader import DatasetInfo
    from components.evaluation import baseline
    from components.evaluation.baseline import random_init_encoder
    from components.runs.scoring import split_features
    from pipelines.cli import main as cli

    run = _run(dataset, tmp_path, "r0")
    e = evaluate_run(run, probe_epochs=20)
    assert e.baseline is not None and e.baseline.k == 20 and e.baseline.seed == 0
    assert np.array_equal(e.baseline.knn_hits, e.knn_hits[20])
    gain = e.baseline.gain(e.knn_hits, e.probe_hits)
    assert set(gain) == {"knn@20", "probe"}
    assert (gain["knn@20"].value, gain["knn@20"].low, gain["knn@20"].high) == (0.0, 0.0, 0.0)
    info = DatasetInfo.load(dataset)
    for seed, same in ((0, True), (1, False)):
        loaded = load_run(_run(dataset, tmp_path / f"s{seed}", "s", train__seed=seed))
        rand = random_init_encoder(loaded.config).state_dict()
        trained = {k[len("encoder."):]: v for k, v in loaded.state.model.items()
                   if k.startswith(("encoder.backbone.", "encoder.projector."))}
        assert len(trained) == len(rand) > 0
        equal = all(torch.equal(v, rand[k]) for k, v in trained.items())
        assert equal is same, seed
    # what evaluate_run scores as the baseline of the seed-1 run: the seed-1 encoder's features
    seen: dict[str, torch.Tensor] = {}
    score = baseline.score_baseline

    def spy(bank_f: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen["bank"] = bank_f
        return score(bank_f, *args, **kwargs)

    monkeypatch.setattr(baseline, "score_baseline", spy)
    e1 = evaluate_run(tmp_path / "s1" / "s", probe_epochs=20)
    assert e1.baseline is not None and e1.baseline.seed == 1
    loaded = load_run(tmp_path / "s1" / "s")
    cfg = loaded.config
    want, _ = split_features(cfg, info, random_init_encoder(cfg), "train", torch.device("cpu"))
    got_trained, _ = split_features(cfg, info, loaded.encoder(), "train", torch.device("cpu"))
    assert torch.equal(seen["bank"], want) and not torch.allclose(seen["bank"], got_trained)
    monkeypatch.undo()

    assert main([str(run)]) == 0
    out = run / "eval"
    report = (out / "report.md").read_text()
    assert "| random init | — | seed=0 | 0 | — | — | — | " in report  # kNN@20 only
    assert "gain kNN@20 vs random init | gain probe vs random init |" in report
    assert "| r0 | " in report and "| random init | " in report.split("gain kNN@20")[1]
    m = json.loads((out / "metrics.json").read_text())["baseline"]
    assert m["name"] == "random init" and m["k"] == 20 and m["seed"] == 0
    assert m["knn_top1"] == pytest.approx(e.baseline.knn_top1)
    assert m["probe_top1"] == pytest.approx(e.baseline.probe_top1)
    assert set(m["gain"]) == {"knn@20", "probe"} and set(m["intervals"]) == {"knn@20", "probe"}

    assert cli(["evaluate", str(run), "--no-baseline"]) == 0
    assert "random init" not in (out / "report.md").read_text()
    assert "baseline" not in json.loads((out / "metrics.json").read_text())

"""One kNN rule (issue 40, defect 8).

``simgraph evaluate`` scored kNN with a fixed temperature (0.07) while a sweep's confirmation
and the online monitor used ``knn.temperature``: two different "kNN top-1" numbers for the same
encoder. Now one definition (:class:`components.evaluation.knn.KnnRule`, from the run's
``knn`` section: k, τ, weighted votes, the bank split) is used by all three, and every report
names it: ``kNN top-1 (k=40, τ=0.02, weighted)``.

Here one in-process run (1 epoch, the online kNN on val) is scored by ``evaluate`` and by the
confirmation's scorer on the same split: the same per-image hits and the same number as the
online monitor's ``knn_top1``, and the temperature matters for this encoder (the old fixed
0.07 gives another number), so the test tells the rules apart (on images whose neighbours
split between two labels, so the vote weights decide).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from components.config import PretrainConfig, from_dict
from components.runs.recipe import run_pretraining
from tests.support.datasets import synthetic_dataset, tiny_run_config

K, TAU = 40, 0.02  # k not among evaluate's curve of k: the rule's k is scored anyway
RULE = f"kNN top-1 (k={K}, τ={TAU:g}, weighted)"


pytestmark = pytest.mark.usefixtures("no_jit")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:func:`synthetic_dataset` whose labels its images show only in part: every other image
    of a class's pattern is labelled as the next class, so each image's neighbours split
    between two labels and the vote weights (the temperature) decide."""
    from components.data.shards import page_size_for, write_shard
    from components.io.files import sha256_file
    from tests.support.datasets import _image

    root = synthetic_dataset(tmp_path_factory.mktemp("knnrule") / "ds")
    manifest = json.loads((root / "manifest.json").read_text())
    rng = np.random.default_rng(7)
    for split, per in (("train", 32), ("val", 8)):
        pattern = np.repeat(np.arange(4), per)
        labels = (pattern + np.arange(len(pattern)) % 2) % 4
        ids = np.arange(len(labels)) + (0 if split == "train" else 1000)
        caps = np.zeros((len(labels), 8), dtype=np.float32)
        write_shard(root / f"{split}.beton", [_image(rng, int(c), 16) for c in pattern],
                    labels, ids, caps, write_mode="raw", jpeg_quality=90,
                    page_size=page_size_for(16, 8 * 4))
        manifest["splits"][split]["sha256"] = sha256_file(root / f"{split}.beton")
    manifest["params_digest"] += "-split-labels"
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_the_rule_is_named_from_the_config() -> None:
    from components.config import KNNConfig
    from components.evaluation.knn import KnnRule

    rule = KnnRule.of(KNNConfig())
    assert (rule.k, rule.temperature, rule.bank_split) == (200, 0.07, "train")
    assert rule.name() == "kNN top-1 (k=200, τ=0.07, weighted)"
    assert rule.name(k=20) == "kNN top-1 (k=20, τ=0.07, weighted)"
    assert rule.describe("test") == ("kNN top-1 (k=200, τ=0.07, weighted) of the test images "
                                     "against the train bank")
    with pytest.raises(ValueError, match="temperature"):
        KnnRule(k=5, temperature=0.0)
    with pytest.raises(ValueError, match="k="):
        KnnRule(k=0, temperature=0.1)


def test_evaluate_confirmation_and_the_online_kNN_give_one_number(
        dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from components.evaluation.knn import knn_hits, weighted_knn_predict
    from components.evaluation.report import write_comparison, write_report
    from components.runs.evaluate import evaluate_run
    from components.runs.scoring import load_run, split_features, split_knn_hits
    from components.sweep.confirmation import Candidate, closing_line, summarise, table

    cfg = from_dict(PretrainConfig, tiny_run_config(
        dataset, tmp_path, name="r", train__epochs=1,
        knn={"k": K, "temperature": TAU, "every_epochs": 1},
        scaling={"num_workers": 1, "cpus_per_worker": 1.0, "host": "in_process"}))
    history = run_pretraining(cfg, echo=False)
    said = capsys.readouterr().out
    assert f"online {RULE} of the val images against the train bank" in said
    online = history[-1]["knn_top1"]
    run = tmp_path / "r"

    e = evaluate_run(run, probe_epochs=5, baseline=False)
    assert e.query_split == "val"  # no test split: the online monitor's query split
    confirmed = split_knn_hits(str(run), "val")  # what a sweep's confirm: stage scores
    assert K in e.knn_hits and np.array_equal(e.knn_hits[K], confirmed)
    summary = e.summary()
    assert summary["knn_rule"] == {"k": K, "temperature": TAU, "votes": "weighted",
                                   "bank_split": "train", "name": RULE}
    assert summary["knn_top1"]["value"] == pytest.approx(confirmed.mean(), abs=0)
    assert online == pytest.approx(confirmed.mean(), abs=0)
    assert e.knn[K]["top1"] == pytest.approx(online, abs=1e-12)

    # the temperature matters for this encoder: the old fixed 0.07 scores differently
    loaded = load_run(run)
    rcfg, info, encoder = loaded.config, loaded.dataset(), loaded.encoder()
    cpu = torch.device("cpu")
    bank_f, bank_y = split_features(rcfg, info, encoder, "train", cpu)
    query_f, query_y = split_features(rcfg, info, encoder, "val", cpu)
    old = weighted_knn_predict(bank_f, bank_y, query_f, K, 4, temperature=0.07)
    assert not np.array_equal(knn_hits(old[K], query_y, 1).numpy(), confirmed)

    # every report names the rule
    write_report(e)
    report = (run / "eval" / "report.md").read_text()
    assert f"{RULE} of the val images against the train bank: " in report
    assert f"{100 * confirmed.mean():.1f} %" in report
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    assert metrics["knn_rule"]["name"] == RULE
    write_comparison([e, e], str(tmp_path / "cmp"))
    assert f"r: {RULE}" in (tmp_path / "cmp" / "comparison.md").read_text()
    conf = summarise({1: [confirmed]}, [Candidate(1, {"tau": 0.2}, online)], "val",
                     curse_comparable=True, rule=RULE)
    assert conf.rule == RULE
    assert f"val {RULE} % [95 % CI]" in table(conf, "knn_top1")
    assert f"val {RULE} {100 * confirmed.mean():.1f} %" in closing_line(conf, 1)

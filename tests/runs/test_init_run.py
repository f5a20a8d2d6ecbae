"""A run started from ``model.init`` (issue 43 item 2), in process (one worker, no Ray): the
recipe's starting backbone is the file's, the driver refuses a file that does not fit before
the run dir exists, a resume finding another file under the path is refused; end to end
(slow): the summary line, ``init.json``, the model card, and evaluate's "init weights"
baseline, whose kNN is the kNN of the init encoder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from components.config import PretrainConfig, from_dict
from components.io.files import sha256_file
from components.models.encoders import build_encoder
from components.models.init_weights import InitWeightsError
from components.runs.errors import RunError
from components.runs.hosts import InProcess
from components.runs.recipe import loop_config
from components.runs.run_dir import prepare_run
from components.runs.worker import PretrainRecipe
from tests.support.datasets import synthetic_dataset, tiny_run_config


def _cfg(data: Path, runs: Path, init: Path, name: str = "init", **over: object) -> PretrainConfig:
    return from_dict(PretrainConfig, tiny_run_config(
        data, runs, name=name, model__init=str(init), knn__every_epochs=0,
        scaling={"num_workers": 1, "cpus_per_worker": 1.0}, **over))


def _init_file(path: Path, seed: int, cfg: PretrainConfig) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    state = build_encoder(cfg.model, 16).backbone.state_dict()
    save_file(state, str(path))
    return state


def test_the_recipe_starts_from_the_file_and_a_changed_file_is_refused(tmp_path: Path) -> None:
    data = synthetic_dataset(tmp_path / "ds", train_per_class=8, val_per_class=2)
    init = tmp_path / "start.safetensors"
    cfg = _cfg(data, tmp_path / "runs", init)
    state = _init_file(init, 7, cfg)
    run = prepare_run(cfg)
    assert run.facts.init["sha256"] == sha256_file(init)
    assert run.facts.init["summary"] == f"{init}: 12 of 12 backbone tensors (projector: random)"
    record = json.loads((Path(run.run_dir) / "init.json").read_text())
    assert record == {"path": str(init), "sha256": sha256_file(init)}

    recipe = PretrainRecipe(loop_config(run.cfg, run.run_dir, run.facts),
                            host=InProcess(run.run_dir, 1))
    recipe.setup()
    try:
        assert recipe.ema is not None  # supcon with a bank: its EMA copy starts there too
        for module in (recipe.model.encoder, recipe.ema.module):
            for k, v in module.backbone.state_dict().items():
                assert torch.equal(v, state[k]), k
        assert recipe.step == 0
    finally:
        recipe.cleanup()

    _init_file(init, 8, cfg)  # another file under the same path
    with pytest.raises(RunError) as e:
        prepare_run(cfg)
    assert str(e.value) == (
        f"run 'init' started from model.init {init} with sha256 {record['sha256'][:12]}…, but "
        f"that path now holds another file (sha256 {sha256_file(init)[:12]}…); restore the "
        "original file, or start a new run (a new name=)")


def test_a_file_that_does_not_fit_is_refused_before_the_run_dir_exists(tmp_path: Path) -> None:
    data = synthetic_dataset(tmp_path / "ds", train_per_class=8, val_per_class=2)
    init = tmp_path / "wide.safetensors"
    wide = _cfg(data, tmp_path / "runs", init, model__width=16)
    _init_file(init, 0, wide)
    with pytest.raises(InitWeightsError, match=r"tensor features.0.weight has shape \[16, 3, 3, "
                       r"3\] but convnet's features.0.weight has shape \[8, 3, 3, 3\]"):
        prepare_run(_cfg(data, tmp_path / "runs", init))
    with pytest.raises(InitWeightsError, match="no such file"):
        prepare_run(_cfg(data, tmp_path / "runs", tmp_path / "gone.pth"))
    assert not (tmp_path / "runs" / "init").exists()


@pytest.mark.slow
def test_a_run_from_an_export_reports_its_start_everywhere(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from components.runs.evaluate import evaluate_run
    from components.runs.recipe import run_pretraining
    from pipelines.export import main as export

    data = synthetic_dataset(tmp_path / "ds", train_per_class=8, val_per_class=4)
    first = from_dict(PretrainConfig, tiny_run_config(
        data, tmp_path / "runs", name="first", knn__every_epochs=0, train__epochs=1,
        scaling={"num_workers": 1, "cpus_per_worker": 1.0}))
    run_pretraining(first, echo=False)
    assert export(str(tmp_path / "runs" / "first"), out=str(tmp_path / "exp")) == 0
    init = tmp_path / "exp" / "model.safetensors"

    second = _cfg(data, tmp_path / "runs", init, name="second", train__epochs=1)
    capsys.readouterr()
    run_pretraining(second)
    out = capsys.readouterr().out
    assert f"  init    {init}: 12 of 12 backbone tensors (projector: random)\n" in out

    ev_first = evaluate_run(tmp_path / "runs" / "first", probe_epochs=5)
    ev = evaluate_run(tmp_path / "runs" / "second", probe_epochs=5)
    assert ev.baseline is not None and ev.baseline.name == "init weights"
    # the init weights are the first run's trained backbone: the same features, the same kNN
    assert ev.baseline.knn_top1 == ev_first.knn[ev.baseline.k]["top1"]
    from components.evaluation.report import comparison_table, interval_table

    assert "\n| init weights | — | seed=0 | 0 |" in comparison_table([ev])
    assert f"gain kNN@{ev.baseline.k} vs init weights" in interval_table([ev])

    assert export(str(tmp_path / "runs" / "second"), out=str(tmp_path / "exp2")) == 0
    card = (tmp_path / "exp2" / "model_card.md").read_text()
    assert f"Initialised from `model.safetensors` (sha256 {sha256_file(init)};" in card
    described = json.loads((tmp_path / "exp2" / "config.json").read_text())
    assert described["init"]["sha256"] == sha256_file(init)

    init.unlink()  # a resume never reads the file: it trains on from its checkpoint
    run_pretraining(_cfg(data, tmp_path / "runs", init, name="second", train__epochs=2))
    out = capsys.readouterr().out
    assert f"  init    {init}: not found (the run resumes from its checkpoint" in out
    assert "resumed 'second' after epoch 1" in out


def test_a_resume_goes_on_without_the_file(tmp_path: Path) -> None:
    from tests.support.datasets import run_with_checkpoint

    data = synthetic_dataset(tmp_path / "ds", train_per_class=8, val_per_class=2)
    init = tmp_path / "start.safetensors"
    over = {"model__init": str(init), "knn__every_epochs": 0,
            "scaling": {"num_workers": 1, "cpus_per_worker": 1.0}}
    cfg = from_dict(PretrainConfig, tiny_run_config(data, tmp_path / "runs", name="r", **over))
    _init_file(init, 7, cfg)
    run_with_checkpoint(data, tmp_path / "runs", "r", **over)
    init.unlink()  # gone: the checkpoint holds the weights, the resume goes on
    run = prepare_run(cfg)
    assert run.facts.init["summary"] == (f"{init}: not found (the run resumes from its "
                                         "checkpoint, which holds the weights)")
    assert run.facts.init["sha256"] is None  # nothing to compare: init.json left as it is


def test_workers_on_a_node_without_the_file_start_from_the_drivers_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``model.init`` is a path on the driver's node: a Ray Train worker elsewhere has no file
    there. make_trainer ships the bytes the driver checked (through the object store, once per
    node) and the worker loads them; the file changed or gone before that is refused."""
    import ray

    from components.runs.init_checks import init_payload
    from components.runs.recipe import make_trainer

    data = synthetic_dataset(tmp_path / "ds", train_per_class=8, val_per_class=2)
    init = tmp_path / "start.safetensors"
    cfg = _cfg(data, tmp_path / "runs", init)
    state = _init_file(init, 7, cfg)
    run = prepare_run(cfg)
    put: list[bytes] = []
    monkeypatch.setattr(ray, "put", lambda b: put.append(b) or f"ref-{len(put)}")
    trainer = make_trainer(run.cfg, run.run_dir, run.facts)
    assert put == [init.read_bytes()]  # one copy in the object store, not one per worker
    assert trainer.train_loop_config["init_weights"] == "ref-1"

    shipped = init_payload(run.facts.init)
    assert shipped == init.read_bytes()
    init.rename(tmp_path / "elsewhere.safetensors")  # this "node" has no file at the path
    recipe = PretrainRecipe({**loop_config(run.cfg, run.run_dir, run.facts),
                             "init_weights": shipped}, host=InProcess(run.run_dir, 1))
    recipe.setup()
    try:
        assert recipe.ema is not None
        for module in (recipe.model.encoder, recipe.ema.module):
            for k, v in module.backbone.state_dict().items():
                assert torch.equal(v, state[k]), k
    finally:
        recipe.cleanup()

    with pytest.raises(RunError) as e:  # gone between the check and the start
        init_payload(run.facts.init)
    assert str(e.value) == (f"model.init {init} cannot be read any more (No such file or "
                            "directory); start the run again")
    (tmp_path / "elsewhere.safetensors").rename(init)
    _init_file(init, 8, cfg)  # changed between the check and the start
    with pytest.raises(RunError, match="changed since the run was prepared"):
        init_payload(run.facts.init)
    assert init_payload({**run.facts.init, "load": False}) is None  # a resume ships nothing

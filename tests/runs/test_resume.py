"""A resume continues the same experiment or refuses: a run whose dataset was rebuilt (or
replaced) since it started is refused before any training, by the driver (``dataset.json``,
or the newest checkpoint of a run dir from before it) and by the recipe itself whatever host
hands it the checkpoint; nothing in the run dir is touched by the refusal. No Ray: the recipe
runs in this process (as in test_run_host)."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from components.config import PretrainConfig, from_dict
from components.runs.dataset_checks import check_dataset
from components.runs.errors import RunError
from components.runs.hosts import TuneTrial
from components.runs.recipe import loop_config
from components.runs.run_dir import RUN_DATASET, prepare_run, prepare_run_dir
from components.runs.worker import PretrainRecipe
from tests.support.datasets import synthetic_dataset, tiny_run_config

REFUSAL = (r"run 'run' trained on other data than .*/ds holds now \(build parameters, split "
           r"files \(train, val\) differ.*Restore the dataset it trained on, or start a new run")


class _Quiet(TuneTrial):
    def send(self, result: dict[str, Any]) -> None:
        pass


def _config(data: Path, storage: Path, epochs: int) -> PretrainConfig:
    return from_dict(PretrainConfig, tiny_run_config(
        data, storage, train__epochs=epochs, knn__every_epochs=0,
        scaling={"num_workers": 1, "cpus_per_worker": 1.0}))


def _train(cfg: PretrainConfig) -> str:
    run = prepare_run(cfg)  # what `simgraph pretrain` and every sweep trial do first
    assert run.finished is None
    PretrainRecipe(loop_config(run.cfg, run.run_dir, run.facts, pause_at_step=0),
                   host=_Quiet(run.run_dir, None, "loss")).run()
    return run.run_dir


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_resume_on_a_rebuilt_dataset_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    synthetic_dataset(data, size=16, train_per_class=8, val_per_class=2, seed=0)
    shutil.copytree(data, tmp_path / "original")
    run_dir = Path(_train(_config(data, tmp_path / "runs", epochs=1)))
    assert json.loads((run_dir / RUN_DATASET).read_text())["splits"]["train"]
    before = _snapshot(run_dir)

    shutil.rmtree(data)  # rebuilt at the same path, with more images
    synthetic_dataset(data, size=16, train_per_class=12, val_per_class=2, seed=1)
    more = _config(data, tmp_path / "runs", epochs=2)
    with pytest.raises(RunError, match=REFUSAL):
        _train(more)
    assert _snapshot(run_dir) == before  # nothing written, the checkpoint kept

    # A run dir from before dataset.json: its newest checkpoint names the data.
    (run_dir / RUN_DATASET).unlink()
    with pytest.raises(RunError, match=REFUSAL):
        _train(more)
    assert not (run_dir / RUN_DATASET).exists()

    # The recipe checks what any host hands it (e.g. Ray's snapshot), past the driver.
    facts = check_dataset(more)
    host = _Quiet(str(run_dir), None, "loss")
    recipe = PretrainRecipe(loop_config(more, str(run_dir), facts, pause_at_step=0), host=host)
    with pytest.raises(RunError, match=REFUSAL):
        recipe.setup()

    # The way out the message names: the original data back, and the run resumes.
    shutil.rmtree(data)
    shutil.copytree(tmp_path / "original", data)
    _train(more)
    assert sorted(p.name for p in run_dir.glob("epoch_*")) == ["epoch_00001", "epoch_00002"]
    assert (run_dir / RUN_DATASET).exists()


def test_a_fresh_run_records_its_dataset(tmp_path: Path) -> None:
    data = synthetic_dataset(tmp_path / "ds", size=16, train_per_class=4, val_per_class=2)
    cfg = _config(data, tmp_path / "runs", epochs=1)
    facts = check_dataset(cfg)
    run_dir = Path(prepare_run_dir(cfg, facts.dataset))
    assert json.loads((run_dir / RUN_DATASET).read_text()) == facts.dataset
    with contextlib.suppress(RunError):  # the same data again: accepted
        prepare_run_dir(cfg, facts.dataset)
    prepare_run_dir(cfg, facts.dataset)


def test_prepare_run_checks_the_data_without_building_a_model_and_sees_a_finished_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One preparation for `simgraph pretrain` and sweep trials: the driver learns what the
    loss reads from its objective alone (no backbone), and a finished run comes back with
    its history instead of training again."""
    from components.models import encoders as models

    data = synthetic_dataset(tmp_path / "ds", size=16, train_per_class=8, val_per_class=2)
    cfg = _config(data, tmp_path / "runs", epochs=1)

    def no_model(*a: Any, **k: Any) -> Any:
        raise AssertionError("the driver built a backbone")

    with monkeypatch.context() as m:
        m.setattr(models, "build_backbone", no_model)
        facts = check_dataset(cfg)
    assert facts.num_classes == 4 and facts.splits["train"] == 32
    run_dir = _train(cfg)
    again = prepare_run(cfg)
    assert again.run_dir == run_dir and again.finished is not None
    assert [row["epoch"] for row in again.finished] == [1]
    longer = prepare_run(_config(data, tmp_path / "runs", epochs=2))  # resumable change
    assert longer.finished is None

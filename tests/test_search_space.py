"""Search spaces: validation against the config dataclasses, conditional define-by-run,
trial configs that round-trip the sampled values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from components.config import ConfigError
from components.search_space import define_by_run, load_sweep, trial_config

ROOT = Path(__file__).resolve().parents[1]
BASE = str(ROOT / "pipelines/configs/pretrain/demo.yaml")


def _write(tmp: Path, **over: Any) -> Path:
    spec: dict[str, Any] = {
        "name": "t", "base": BASE, "metric": "knn_top1", "mode": "max", "num_samples": 4,
        "searcher": {"name": "random", "seed": 0},
        "space": {"loss.name": {"choice": ["simclr", "xclr", "eps_supinfonce"]},
                  "loss.tau": {"loguniform": [0.05, 0.5]}},
        "conditional": {"loss.name": {"xclr": {"loss.tau_s": {"loguniform": [0.01, 1.0]}},
                                      "eps_supinfonce": {"loss.epsilon": {"uniform": [0, 0.5]}}}},
    }
    if "space" in over and "conditional" not in over:
        spec["conditional"] = {}
    spec.update(over)
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_conditional_parameters_only_in_their_branch(tmp_path: Path) -> None:
    sweep = load_sweep(_write(tmp_path))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0), direction="maximize")
    space = define_by_run(sweep)
    seen = set()
    for _ in range(30):
        trial = study.ask()
        space(trial)
        p = trial.params
        seen.add(p["loss.name"])
        assert ("loss.tau_s" in p) == (p["loss.name"] == "xclr")
        assert ("loss.epsilon" in p) == (p["loss.name"] == "eps_supinfonce")
        assert 0.05 <= p["loss.tau"] <= 0.5
        cfg = trial_config(sweep, p, name="0123", storage="/tmp")  # round trip
        assert cfg.name == "0123"
        assert cfg.loss.name == p["loss.name"] and cfg.loss.tau == p["loss.tau"]
        if "loss.tau_s" in p:
            assert cfg.loss.tau_s == p["loss.tau_s"]
        study.tell(trial, 0.0)
    assert seen == {"simclr", "xclr", "eps_supinfonce"}


@pytest.mark.parametrize(
    ("over", "error"),
    [
        ({"space": {"loss.tau": {"grid": [0.1, 0.2]}}}, "Optuna does not do grid search"),
        ({"space": {"loss.tau": {"uniform": [0.5, 0.1]}}}, "empty range"),
        ({"space": {"optim.lr": {"loguniform": [0.0, 1.0]}}}, "touches 0"),
        ({"space": {"loss.tau": {"uniform": [0.0, 0.5]}}}, "temperatures must be > 0"),
        ({"space": {"optim.lrr": {"uniform": [0.1, 0.5]}}}, r"optim\.lrr.*allowed keys"),
        ({"space": {"loss.name": {"choice": ["sincere"]}},
          "conditional": {"loss.name": {"sincere": {"loss.tau_s": {"uniform": [0.1, 1]}}}}},
         r"loss\.tau_s for 'sincere'; allowed keys"),
        ({"conditional": {"loss.tau": {"a": {}}}}, "must be a choice parameter"),
        ({"conditional": {"loss.name": {"ce": {}}}}, "is not one of its choices"),
        ({"metric": "accuracy"}, "not reported by pretraining"),
        ({"searcher": {"name": "grid"}}, "choose tpe, random or cmaes"),
        ({"study_storage": "postgres://x"}, "sqlite:///"),
        ({"space": {"loss.epsilon": {"uniform": [-0.2, 0.5]}},
          "overrides": ["loss.name=eps_supinfonce"]}, r"loss\.epsilon"),
    ],
)
def test_refusals_name_the_parameter(tmp_path: Path, over: dict, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        load_sweep(_write(tmp_path, **over))


def test_command_line_overrides(tmp_path: Path) -> None:
    path = _write(tmp_path)
    assert load_sweep(path, ["num_samples=2", "searcher.seed=3"]).num_samples == 2
    with pytest.raises(ConfigError, match="may be overridden"):
        load_sweep(path, ["space.x=1"])


@pytest.mark.parametrize("path", sorted((ROOT / "search_spaces").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_shipped_spaces_validate(path: Path) -> None:
    sweep = load_sweep(path)
    assert sweep.base_path.exists() and sweep.parameters()

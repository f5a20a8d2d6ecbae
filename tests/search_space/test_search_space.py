"""Search spaces (components/search_space/): refusals name the parameter, every path is checked
per conditional branch against the config dataclasses, the define-by-run space samples each
branch's parameters only in that branch, and trial configs take the sampled values as values."""

from __future__ import annotations

import math
import pickle
import statistics
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from components.config import ConfigError, PretrainConfig, load_config
from components.search_space import (
    Distribution,
    SweepConfig,
    define_by_run,
    load_sweep,
    make_sampler,
    optuna_distributions,
    trial_config,
    trial_values,
)

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "pipelines/configs/pretrain/demo.yaml"
SHIPPED = sorted((ROOT / "search_spaces").rglob("*.yaml"))
SMALL = sorted((ROOT / "search_spaces" / "small_data").glob("*.yaml"))
SMALL_BASE = ROOT / "pipelines" / "configs" / "pretrain" / "small_data.yaml"

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _spec(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "t", "base": str(BASE), "storage": "runs/sweeps", "metric": "knn_top1",
        "mode": "max", "num_samples": 8, "overrides": ["train.epochs=4"],
        "searcher": {"name": "random", "seed": 0},
        "space": {"loss.name": {"choice": ["simclr", "xclr", "eps_supinfonce", "cone"]},
                  "optim.lr": {"loguniform": [0.01, 1.0]}},
        "conditional": {"loss.name": {
            "simclr": {"loss.tau": {"loguniform": [0.05, 0.5]}},
            "xclr": {"loss.tau": {"loguniform": [0.05, 0.5]},
                     "loss.tau_s": {"loguniform": [0.01, 1.0]}},
            "eps_supinfonce": {"loss.tau": {"loguniform": [0.05, 0.5]},
                               "loss.epsilon": {"uniform": [0.0, 0.5]}},
            "cone": {"loss.bank_size": {"int": [1024, 65536], "log": True},
                     "loss.top_n": {"int": [8, 512]}},
        }},
    }
    spec.update(over)
    return spec


def _write(tmp: Path, **over: Any) -> Path:
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(_spec(**over), sort_keys=False))
    return path


def _sample(sweep: SweepConfig, n: int, seed: int = 0) -> list[dict[str, Any]]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed),
                                direction="maximize")
    space = define_by_run(sweep)
    out = []
    for i in range(n):
        trial = study.ask()
        assert space(trial) is None  # Ray's OptunaSearch contract: constants or None
        out.append(dict(trial.params))
        study.tell(trial, float(i))
    return out


# ---------------------------------------------------------------------------------------------
# Shipped search spaces.


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_space_loads_validates_and_builds_trials(path: Path) -> None:
    sweep = load_sweep(path)
    assert sweep.base_path in (BASE.resolve(), SMALL_BASE.resolve())
    assert sweep.parameters() and sweep.num_samples >= 1
    make_sampler(sweep)
    for params in _sample(sweep, 6):  # every sampled trial is a valid pretrain config
        cfg = trial_config(sweep, params, name="trial", storage="/tmp/sweep")
        assert cfg.scaling.num_workers == sweep.resources.workers
        for p, v in params.items():
            section, key = p.split(".")
            assert getattr(getattr(cfg, section), key) == v, p


def test_small_data_sweeps_give_every_loss_the_same_budget() -> None:
    """bench/reproduce.py --tune compares losses each at its best setting: that is fair only
    if every loss gets the same trials, searcher, scheduler and LR range on the same base."""
    sweeps = {p.stem: load_sweep(p) for p in SMALL}
    assert set(sweeps) == {"simclr", "supcon", "xclr", "sincere", "cone", "ce"}
    first = sweeps["simclr"]
    for stem, sw in sweeps.items():
        assert sw.base_path == SMALL_BASE.resolve(), stem
        assert f"loss.name={stem}" in sw.overrides, stem
        assert sw.name == f"small-{stem}"
        assert (sw.num_samples, sw.searcher, sw.scheduler, sw.resources, sw.metric) == (
            first.num_samples, first.searcher, first.scheduler, first.resources, first.metric)
        assert sw.scheduler.name == "fifo"  # every trial runs its full budget
        assert sw.space["optim.lr"] == Distribution(kind="loguniform", low=3e-4, high=3e-3,
                                                    log=True)
        # a loss with a temperature searches it over the papers' range
        if stem in ("simclr", "supcon", "xclr", "sincere"):
            assert sw.space["loss.tau"] == Distribution(kind="loguniform", low=0.05, high=0.5,
                                                        log=True)
        assert len(sw.parameters()) >= 2, stem  # the LR and at least one of the loss's own
    # trial + Train worker fit this 2-CPU machine: the trial actor holds 0.25 CPU
    assert first.resources.workers * first.resources.cpus_per_worker + 0.25 <= 2


def test_shipped_spaces_are_what_they_say() -> None:
    spaces = {p.stem: load_sweep(p) for p in SHIPPED if p.parent.name == "search_spaces"}
    assert set(spaces) == {"xclr_temperature", "eps_margin", "cone_weights", "across_losses",
                           "demo"}
    x = spaces["xclr_temperature"]
    assert "loss.name=xclr" in x.overrides and x.scheduler.name == "asha"
    assert x.space["loss.tau_s"] == Distribution(kind="loguniform", low=0.01, high=1.0, log=True)
    assert x.space["loss.tau"] == Distribution(kind="loguniform", low=0.05, high=0.5, log=True)
    e = spaces["eps_margin"]
    assert "loss.name=eps_supinfonce" in e.overrides
    assert e.space["loss.epsilon"] == Distribution(kind="uniform", low=0.0, high=0.5)  # 0 = SINCERE
    c = spaces["cone_weights"].space
    assert c["loss.bank_size"] == Distribution(kind="int", low=1024, high=65536, log=True)
    assert c["loss.top_n"] == Distribution(kind="int", low=8, high=512, log=True)
    a = spaces["across_losses"]
    assert "loss.tau" not in a.space and "loss.tau" not in a.conditional["loss.name"]["cone"]
    assert set(a.space["loss.name"].values or ()) == {"simclr", "supcon", "xclr", "sincere",
                                                      "eps_supinfonce", "cone"}
    d = spaces["demo"]
    assert (d.num_samples, d.max_concurrent, d.resources.workers) == (4, "auto", 1)
    assert (d.scheduler.grace_period, d.scheduler.reduction_factor) == (1, 2)
    assert trial_config(d, {"loss.name": "simclr", "loss.tau": 0.1}, "x", "/tmp").train.epochs == 2


# ---------------------------------------------------------------------------------------------
# Define-by-run sampling.


def test_conditional_parameters_appear_only_in_their_branch(tmp_path: Path) -> None:
    sweep = load_sweep(_write(tmp_path))
    branch_keys = {
        "simclr": {"loss.tau"}, "xclr": {"loss.tau", "loss.tau_s"},
        "eps_supinfonce": {"loss.tau", "loss.epsilon"}, "cone": {"loss.bank_size", "loss.top_n"},
    }
    seen = set()
    for p in _sample(sweep, 30):
        loss = p["loss.name"]
        seen.add(loss)
        assert set(p) == {"loss.name", "optim.lr"} | branch_keys[loss]
        for path, value in p.items():
            assert sweep.parameters()[path].contains(value), (path, value)
        if loss == "cone":
            assert type(p["loss.bank_size"]) is int and type(p["loss.top_n"]) is int
    assert seen == set(branch_keys)


def test_log_and_int_scales_reach_optuna(tmp_path: Path) -> None:
    sweep = load_sweep(_write(tmp_path))
    dists = optuna_distributions(sweep)
    assert dists["optim.lr"] == optuna.distributions.FloatDistribution(0.01, 1.0, log=True)
    assert dists["loss.epsilon"] == optuna.distributions.FloatDistribution(0.0, 0.5)
    assert dists["loss.bank_size"] == optuna.distributions.IntDistribution(1024, 65536, log=True)
    assert dists["loss.top_n"] == optuna.distributions.IntDistribution(8, 512)
    # Log-uniform on [0.01, 1]: median 0.1 (uniform would give ~0.5).
    lrs = [p["optim.lr"] for p in _sample(sweep, 200, seed=1)]
    assert 0.05 < statistics.median(lrs) < 0.2 and min(lrs) >= 0.01 and max(lrs) <= 1.0


def test_same_seed_same_parameters(tmp_path: Path) -> None:
    sweep = load_sweep(_write(tmp_path))
    assert _sample(sweep, 10, seed=3) == _sample(sweep, 10, seed=3)
    assert _sample(sweep, 10, seed=3) != _sample(sweep, 10, seed=4)
    runs = []
    for _ in range(2):  # the sweep's own sampler (TPE past its startup trials) too
        tpe = load_sweep(_write(tmp_path, searcher={"name": "tpe", "seed": 5,
                                                    "startup_trials": 3}))
        study = optuna.create_study(sampler=make_sampler(tpe), direction="maximize")
        space = define_by_run(tpe)
        params = []
        for i in range(8):
            trial = study.ask()
            space(trial)
            params.append(trial.params)
            study.tell(trial, float(i % 3))
        runs.append(params)
    assert runs[0] == runs[1]


def test_define_by_run_pickles(tmp_path: Path) -> None:
    """Tune pickles the searcher, with its space, into the sweep state for --resume."""
    sweep = load_sweep(_write(tmp_path))
    space = pickle.loads(pickle.dumps(define_by_run(sweep)))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    space(trial)
    assert "loss.name" in trial.params


# ---------------------------------------------------------------------------------------------
# Trial overrides and configs.


def test_trial_values_order_and_types(tmp_path: Path) -> None:
    """``loss.name`` first (it resets the loss section), the rest by path, then what the sweep
    sets; numpy scalars (Tune / Optuna may hand them out) become plain Python values."""
    np = pytest.importorskip("numpy")
    sweep = load_sweep(_write(tmp_path))
    params = {"optim.lr": np.float64(3e-05), "loss.tau_s": 0.123456789012345,
              "loss.tau": 0.05, "loss.name": np.str_("xclr")}
    values = trial_values(sweep, params, name="0123", storage="/tmp/s")
    assert list(values) == ["loss.name", "loss.tau", "loss.tau_s", "optim.lr", "name",
                            "storage", "scaling.num_workers", "scaling.cpus_per_worker",
                            "scaling.use_gpu"]
    assert type(values["optim.lr"]) is float and values["optim.lr"] == 3e-05
    assert type(values["loss.name"]) is str
    with pytest.raises(ConfigError, match=r"loss.tau: value \[1, 2\] is not allowed"):
        trial_values(sweep, {"loss.tau": [1, 2]}, name="a", storage="/tmp")


def test_trial_config_sets_values_without_yaml_text(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Sampled values reach the config dataclasses as values: exact floats, strings YAML would
    read as other types (``"123"``, ``"true"``, ``"null"``), the sweep's ``overrides`` applied
    first — and no YAML parsing of the sampled values on the way (only the files and the
    sweep's own override text are parsed)."""
    sweep = load_sweep(_write(tmp_path))
    parsed: list[str] = []
    from components.config import loading

    real = loading.safe_load  # every YAML text simgraph reads goes through it

    def spy(text: Any, *a: Any, **k: Any) -> Any:
        parsed.append(text if isinstance(text, str) else "<file>")
        return real(text, *a, **k)

    monkeypatch.setattr(loading, "safe_load", spy)
    tau_s = 0.1 + 0.2  # 0.30000000000000004: every bit kept
    for name in ("123", "true", "null", "a: b"):
        parsed.clear()
        cfg = trial_config(sweep, {"loss.name": "xclr", "loss.tau": 0.05, "loss.tau_s": tau_s,
                                   "optim.lr": 1e-05 * 3}, name=name, storage="/tmp/s")
        assert cfg.name == name and cfg.train.epochs == 4  # the sweep's override, then values
        assert cfg.loss.name == "xclr" and cfg.loss.tau_s == tau_s  # type: ignore[union-attr]
        assert cfg.optim.lr == 1e-05 * 3
        # The base file's text and the override "train.epochs=4"'s value, nothing else.
        assert len(parsed) == 2 and "\nloss:" in parsed[0] and parsed[1] == "4", parsed[1:]
    # Switching the loss by value resets the base's loss section, as an override does.
    cfg = trial_config(sweep, {"loss.name": "cone", "loss.bank_size": 2048, "loss.top_n": 8},
                       name="c", storage="/tmp/s")
    assert cfg.loss.name == "cone" and cfg.loss.bank_size == 2048  # type: ignore[union-attr]
    assert load_config(BASE, PretrainConfig, ["loss.name=cone", "loss.bank_size=2048",
                                              "loss.top_n=8"]).loss == cfg.loss


def test_searcher_state_pickled_before_the_package_split_loads() -> None:
    """Tune's searcher state of a sweep started before ``components/search_space.py`` became a
    package names its classes ``components.search_space.<Class>``: a ``--resume`` must still
    unpickle it."""
    from components.search_space import DefineByRun, Resources
    from components.search_space.sweep_file import SweepConfig as Moved

    assert Moved is SweepConfig
    blob = pickle.dumps(Resources(workers=2), protocol=0)
    old = blob.replace(b"components.search_space.settings", b"components.search_space")
    assert old != blob and pickle.loads(old) == Resources(workers=2)
    assert DefineByRun.__module__ == "components.search_space.optuna_adapter"


def test_sampled_trials_round_trip_through_the_config(tmp_path: Path) -> None:
    sweep = load_sweep(_write(tmp_path))
    for p in _sample(sweep, 20, seed=2):
        cfg = trial_config(sweep, p, name="0123", storage="/tmp/s")
        assert cfg.name == "0123" and cfg.storage == "/tmp/s"  # a numeric id stays a string
        for path, value in p.items():
            section, key = path.split(".")
            got = getattr(getattr(cfg, section), key)
            assert got == value and type(got) is type(value), path


def test_trial_config_takes_the_sweeps_resources(tmp_path: Path) -> None:
    params = {"loss.name": "simclr", "loss.tau": 0.1, "optim.lr": 0.1}
    cpu = load_sweep(_write(tmp_path, resources={"workers": 3, "cpus_per_worker": 0.5}))
    s = trial_config(cpu, params, "a", "/tmp").scaling
    assert (s.num_workers, s.cpus_per_worker, s.use_gpu) == (3, 0.5, False)
    gpu = load_sweep(_write(tmp_path, resources={"workers": 2, "cpus_per_worker": 2,
                                                 "gpus_per_worker": 1}))
    s = trial_config(gpu, params, "a", "/tmp").scaling
    assert (s.num_workers, s.cpus_per_worker, s.use_gpu, s.gpus_per_worker) == (2, 2.0, True, 1.0)
    shared = load_sweep(_write(tmp_path, resources={"workers": 1, "gpus_per_worker": 0.5}))
    s = trial_config(shared, params, "a", "/tmp").scaling
    assert (s.num_workers, s.use_gpu, s.gpus_per_worker) == (1, True, 0.5)


def test_max_concurrent_auto_packs_trials_into_the_cluster(tmp_path: Path) -> None:
    """``max_concurrent: auto``: as many trials as the cluster's CPUs and GPUs hold, counting
    everything a running trial reserves (its actor, and its worker group if any)."""
    from components.sweep.tuner import concurrency

    def fit(resources: dict[str, Any], cluster: dict[str, float], **over: Any) -> int:
        over.setdefault("max_concurrent", "auto")
        return concurrency(load_sweep(_write(tmp_path, resources=resources, **over)), cluster)

    assert fit({"workers": 1}, {"CPU": 2.0}) == 2  # in-trial, 1 CPU each
    assert fit({"workers": 1, "cpus_per_worker": 0.5}, {"CPU": 2.0}) == 4
    assert fit({"workers": 1}, {"CPU": 2.0}, num_samples=1) == 1  # never more than trials
    # A worker group: 2 x 1 CPU + the trial actor's 0.25 = 2.25 CPUs a trial.
    assert fit({"workers": 2, "mode": "worker_group"}, {"CPU": 8.0}) == 3
    # GPUs bind first: 0.5 GPU per in-trial trial, 1 GPU.
    assert fit({"workers": 1, "gpus_per_worker": 0.5}, {"CPU": 16.0, "GPU": 1.0}) == 2
    assert fit({"workers": 1, "gpus_per_worker": 1}, {"CPU": 16.0}) == 1  # none yet: one
    assert fit({"workers": 1}, {"CPU": 16.0}, max_concurrent=3) == 3  # a number is kept


# ---------------------------------------------------------------------------------------------
# Refusals: each names the parameter path (or key) and what is allowed.


@pytest.mark.parametrize(
    ("over", "error"),
    [
        ({"space": {"loss.tau": {"grid": [0.1, 0.2]}}, "conditional": {}},
         r"parameter loss\.tau: .*Optuna does not do grid search; use \{choice"),
        ({"space": {"loss.tau": {"grid_search": [0.1, 0.2]}}, "conditional": {}},
         r"parameter loss\.tau: .*Optuna does not do grid search"),
        ({"space": {"optim.lr": {"normal": [0.1, 0.2]}}, "conditional": {}},
         r"parameter optim\.lr: distribution 'normal' is not allowed: .*uniform, loguniform"),
        ({"space": {"optim.lr": {"uniform": [0.5, 0.1]}}, "conditional": {}},
         r"parameter optim\.lr: .*empty or inverted: low must be < high"),
        ({"space": {"optim.lr": {"uniform": [0.5, 0.5]}}, "conditional": {}},
         r"parameter optim\.lr: .*empty or inverted"),
        ({"space": {"loss.top_n": {"int": [8, 8]}}, "conditional": {}},
         r"parameter loss\.top_n: .*empty or inverted"),
        ({"space": {"loss.name": {"choice": []}}, "conditional": {}},
         r"parameter loss\.name: .*at least one value"),
        ({"space": {"loss.top_n": {"int": [1.5, 8]}}, "conditional": {}},
         r"parameter loss\.top_n: .*integer ends"),
        ({"space": {"optim.lr": {"loguniform": [0.0, 1.0]}}, "conditional": {}},
         r"parameter optim\.lr: log range \[0\.0, 1\.0\] touching 0"),
        ({"space": {"loss.bank_size": {"int": [0, 64], "log": True}}, "conditional": {}},
         r"parameter loss\.bank_size: log range \[0, 64\] touching 0"),
        ({"space": {"optim.lr": {"uniform": [0.1, 1.0], "log": True}}, "conditional": {}},
         r"parameter optim\.lr: log: true is not allowed with uniform; use loguniform"),
        ({"space": {"loss.tau": {"uniform": [0.0, 0.5]}}, "conditional": {}},
         r"parameter loss\.tau: a temperature must be > 0"),
        ({"space": {"knn.temperature": {"uniform": [-0.1, 0.5]}}, "conditional": {}},
         r"parameter knn\.temperature: a temperature must be > 0"),
        ({"space": {"loss.tau": {"choice": [0.1, 0.0]}}, "conditional": {}},
         r"parameter loss\.tau: a temperature must be > 0"),
        ({"space": {"loss.tau": 0.1}, "conditional": {}},
         r"parameter loss\.tau=0\.1 is not allowed: give a distribution"),
        ({"conditional": {"optim.lr": {"0.1": {}}}},
         r"conditional key optim\.lr is not allowed: .*choice parameters: loss\.name"),
        ({"conditional": {"loss.tau": {"a": {}}}}, r"conditional key loss\.tau is not allowed"),
        ({"conditional": {"loss.name": {"sincere": {}}}},
         r"conditional\.loss\.name: branch 'sincere' is not allowed: it is not one of"),
        ({"conditional": {"loss.name": {"xclr": {"optim.lr": {"uniform": [0.1, 0.2]}}}}},
         r"parameter optim\.lr is not allowed both in space and in conditional\.loss\.name\.xclr"),
        ({"conditional": {"loss.name": {
            "simclr": {"loss.tau": {"loguniform": [0.05, 0.5]}},
            "xclr": {"loss.tau": {"loguniform": [0.05, 0.9]}}}}},
         r"parameter loss\.tau has different distributions in conditional\.loss\.name\.simclr "
         r"and conditional\.loss\.name\.xclr"),
        ({"space": {"scaling.num_workers": {"int": [1, 2]}}, "conditional": {}},
         r"parameter scaling\.num_workers is not allowed: .*resources\.workers"),
        ({"overrides": ["optim.lr=0.1"]},
         r"overrides entry 'optim\.lr=0\.1' is not allowed: .*also a search space parameter"),
        ({"overrides": ["scaling.num_workers=2"]}, r"scaling\.num_workers is set by the sweep"),
        ({"space": {}, "conditional": {}}, "space is empty"),
    ],
)
def test_refused_spaces_name_the_parameter(tmp_path: Path, over: dict, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        load_sweep(_write(tmp_path, **over))


def test_unknown_paths_name_the_path_and_the_allowed_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"search space parameter loss\.tau_s: unknown key "
                       r"loss\.tau_s for 'sincere'; allowed keys: tau, bank_size, ema_momentum"
                       r", name .*branch loss\.name='sincere'"):
        load_sweep(_write(tmp_path, space={"loss.name": {"choice": ["xclr", "sincere"]}},
                          conditional={"loss.name": {
                              "xclr": {"loss.tau_s": {"loguniform": [0.01, 1.0]}},
                              "sincere": {"loss.tau_s": {"loguniform": [0.01, 1.0]}}}}))
    with pytest.raises(ConfigError, match=r"search space parameter optim\.lrr: unknown key "
                       r"optim\.lrr for 'adam'; allowed keys: name, lr, "):
        load_sweep(_write(tmp_path, space={"optim.lrr": {"uniform": [0.1, 0.5]}},
                          conditional={}))
    with pytest.raises(ConfigError, match=r"search space parameter optimm\.lr: unknown key "
                       r"optimm .*allowed keys: name, data, storage, model, loss, optim"):
        load_sweep(_write(tmp_path, space={"optimm.lr": {"uniform": [0.1, 0.5]}},
                          conditional={}))
    # An unconditional parameter checked against every value of an unconditional choice.
    with pytest.raises(ConfigError, match=r"search space parameter loss\.tau: unknown key "
                       r"loss\.tau for 'cone'; allowed keys: name, lambda_sup"):
        load_sweep(_write(tmp_path, space={"loss.name": {"choice": ["simclr", "cone"]},
                                           "loss.tau": {"loguniform": [0.05, 0.5]}},
                          conditional={}))
    # The base loss when loss.name is not searched: demo.yaml's is simclr.
    with pytest.raises(ConfigError, match=r"parameter loss\.epsilon: unknown key loss\.epsilon "
                       r"for 'simclr'"):
        load_sweep(_write(tmp_path, space={"loss.epsilon": {"uniform": [0.0, 0.5]}},
                          conditional={}))


def test_range_ends_are_checked_by_the_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"parameter loss\.epsilon: loss\.epsilon=-0\.2 is not "
                       r"allowed: it must be a finite number >= 0"):
        load_sweep(_write(tmp_path, overrides=["loss.name=eps_supinfonce"], conditional={},
                          space={"loss.epsilon": {"uniform": [-0.2, 0.5]}}))
    with pytest.raises(ConfigError, match=r"parameter optim\.momentum: optim\.momentum=1\.5"):
        load_sweep(_write(tmp_path, space={"optim.momentum": {"uniform": [0.5, 1.5]}},
                          conditional={}))
    with pytest.raises(ConfigError, match=r"loss\.top_n / loss\.bank_size: loss\.top_n=512 is "
                       r"not allowed above loss\.bank_size=256"):
        load_sweep(_write(tmp_path, overrides=["loss.name=cone"], conditional={},
                          space={"loss.bank_size": {"int": [256, 4096]},
                                 "loss.top_n": {"int": [8, 512]}}))
    with pytest.raises(ConfigError, match=r"base .* with the sweep's overrides .*unknown key "
                       r"optim\.lrr"):
        load_sweep(_write(tmp_path, overrides=["optim.lrr=0.1"]))


@pytest.mark.parametrize(
    ("over", "error"),
    [
        ({"metric": "accuracy"}, r"metric='accuracy' is not reported by pretraining: choose "
                                 r"one of knn_top1, loss"),
        ({"metric": "loss", "mode": "max"}, r"mode='max' is not allowed with metric='loss'"),
        ({"mode": "maximize"}, r"mode='maximize' is not allowed: choose one of 'max', 'min'"),
        ({"num_samples": 0}, r"num_samples=0 is not allowed"),
        ({"max_concurrent": 0}, r"max_concurrent=0 is not allowed"),
        ({"max_concurrent": "all"}, r"max_concurrent='all' matches none of int \| 'auto'"),
        ({"searcher": {"name": "bayes"}}, r"searcher\.name='bayes' is not allowed: choose one of "
         r"'tpe', 'random', 'cmaes', 'grid'"),
        ({"searcher": {"name": "tpe", "n": 1}},
         r"unknown key searcher\.n .*allowed keys: name, seed, startup_trials"),
        ({"scheduler": {"name": "hyperband"}}, r"scheduler\.name='hyperband' is not allowed"),
        ({"scheduler": {"name": "asha", "max_epochs": 10}},
         r"scheduler\.max_epochs=10 is not allowed: it must be <= the trials' train\.epochs=4"),
        ({"scheduler": {"name": "asha", "grace_period": 5}},
         r"scheduler\.grace_period=5 is not allowed: it must be <= max_epochs=4"),
        ({"scheduler": {"name": "asha", "grace_period": 3, "max_epochs": 2}},
         r"scheduler\.grace_period=3 is not allowed: it must be <= scheduler\.max_epochs=2"),
        ({"resources": {"workers": 0}}, r"resources\.workers=0 is not allowed"),
        ({"resources": {"gpus_per_worker": -1}}, r"resources\.gpus_per_worker=-1\.0"),
        ({"study_storage": "postgres://db"}, r"study_storage='postgres://db' is not allowed: "
                                             r"give sqlite:///"),
        ({"overrides": ["train.epochs=4", "knn.every_epochs=0"]},
         r"metric='knn_top1' needs knn\.every_epochs >= 1"),
        ({"metric": "probe_top1"}, r"metric='probe_top1' needs probe\.every_epochs >= 1 in the "
                                   r"base config or the sweep's overrides, got 0"),
        ({"metric": "probe_top1", "mode": "min",
          "overrides": ["train.epochs=4", "probe.every_epochs=1"]},
         r"mode='min' is not allowed with metric='probe_top1'"),
        ({"base": "missing.yaml"}, r"base='.*missing\.yaml' is not allowed: no such file"),
        ({"spaces": {}}, r"unknown key spaces; allowed keys: name, base, space"),
        ({"name": "a/b"}, r"name='a/b' is not allowed"),
    ],
)
def test_refused_sweep_settings(tmp_path: Path, over: dict, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        load_sweep(_write(tmp_path, **over))


def test_the_online_probe_top1_is_a_sweep_metric(tmp_path: Path) -> None:
    """``probe_top1`` (issue 43 item 4): accepted with the probe on in the base config or the
    sweep's overrides, an accuracy (maximised, with a standard error) like the kNN's."""
    from components.search_space import ACCURACY_METRICS, REPORTED_METRICS

    sweep = load_sweep(_write(tmp_path, metric="probe_top1",
                              overrides=["train.epochs=4", "probe.every_epochs=2"]))
    assert sweep.metric == "probe_top1" and sweep.mode == "max"
    assert "probe_top1" in REPORTED_METRICS and "probe_top1" in ACCURACY_METRICS


def test_loss_component_metrics_and_study_storage_are_accepted(tmp_path: Path) -> None:
    sweep = load_sweep(_write(tmp_path, metric="loss_ce", mode="min",
                              study_storage="journal:study.log"))
    assert sweep.metric == "loss_ce" and sweep.study_storage == "journal:study.log"


def test_distribution_checks_itself() -> None:
    assert Distribution(kind="loguniform", low=0.1, high=1.0).log  # loguniform is always log
    with pytest.raises(ConfigError, match="'grid' is not allowed"):
        Distribution(kind="grid", values=(1, 2))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"choice value \[1, 2\] is not allowed"):
        Distribution(kind="choice", values=([1, 2],))
    with pytest.raises(ConfigError, match="listed twice"):
        Distribution(kind="choice", values=("a", "a"))
    with pytest.raises(ConfigError, match=r"uniform high=nan is not allowed"):
        Distribution(kind="uniform", low=0.0, high=math.nan)


# ---------------------------------------------------------------------------------------------
# Overrides of the sweep file itself; samplers.


def test_sweep_file_overrides(tmp_path: Path) -> None:
    path = _write(tmp_path)
    sweep = load_sweep(path, ["num_samples=4", "searcher.seed=3", "resources.workers=2",
                              "scheduler.name=fifo", "overrides=[train.epochs=2]",
                              "study_storage=sqlite:///s.db", "name=other"])
    assert (sweep.num_samples, sweep.searcher.seed, sweep.resources.workers) == (4, 3, 2)
    assert sweep.scheduler.name == "fifo" and sweep.overrides == ("train.epochs=2",)
    assert sweep.study_storage == "sqlite:///s.db" and sweep.name == "other"
    assert load_sweep(path, ["study_storage="]).study_storage is None
    for bad in ("space.loss.tau={uniform: [0.1, 0.2]}", "base=other.yaml", "conditional={}",
                "foo=1", "name.x=1"):
        with pytest.raises(ConfigError, match=r"is not allowed: a sweep's command line may set "
                           r"name, storage, metric"):
            load_sweep(path, [bad])
    with pytest.raises(ConfigError, match=r"num_samples='many' must be an integer"):
        load_sweep(path, ["num_samples=many"])
    with pytest.raises(ConfigError, match=r"unknown key resources\.gpu "):
        load_sweep(path, ["resources.gpu=1"])


def test_make_sampler(tmp_path: Path) -> None:
    def sampler(**searcher: Any) -> optuna.samplers.BaseSampler:
        return make_sampler(load_sweep(_write(tmp_path, searcher=searcher)))

    assert isinstance(sampler(name="random", seed=1), optuna.samplers.RandomSampler)
    tpe = sampler(name="tpe", seed=1, startup_trials=7)
    assert isinstance(tpe, optuna.samplers.TPESampler)
    assert tpe._n_startup_trials == 7  # no public accessor


def test_cmaes_without_the_package_names_it(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, searcher={"name": "cmaes", "seed": 0})
    monkeypatch.setitem(sys.modules, "cmaes", None)  # makes `import cmaes` fail
    with pytest.raises(ConfigError, match=r"searcher\.name='cmaes' needs the Python package "
                       r"`cmaes`.*pip install cmaes"):
        load_sweep(path)
    sweep = load_sweep(_write(tmp_path, searcher={"name": "tpe"}))
    cmaes_sweep = SweepConfig(**{**sweep.__dict__, "searcher": type(sweep.searcher)("cmaes")})
    with pytest.raises(ConfigError, match="`cmaes`"):
        make_sampler(cmaes_sweep)


def test_cmaes_searcher_builds(tmp_path: Path) -> None:
    # `cmaes` is a dev dependency (pyproject.toml), so this runs wherever the tests do
    sweep = load_sweep(_write(tmp_path, searcher={"name": "cmaes", "seed": 0}))
    assert isinstance(make_sampler(sweep), optuna.samplers.CmaEsSampler)


def test_grid_searcher_runs_every_point_once(tmp_path: Path) -> None:
    """``searcher: grid``: Optuna's GridSampler over the choices, each combination exactly
    once in ``num_samples`` trials, through the same define-by-run space as Tune uses."""
    space = {"loss.tau": {"choice": [0.05, 0.1, 0.2]}, "loss.tau_s": {"choice": [0.02, 0.1]}}
    sweep = load_sweep(_write(tmp_path, space=space, conditional={}, num_samples=6,
                              overrides=["loss.name=xclr"], searcher={"name": "grid", "seed": 3}))
    sampler = make_sampler(sweep)
    assert isinstance(sampler, optuna.samplers.GridSampler)
    sampler = pickle.loads(pickle.dumps(sampler))  # Tune pickles the searcher for --resume
    study = optuna.create_study(sampler=sampler, direction="maximize")
    fn = define_by_run(sweep)
    seen = []
    for _ in range(6):
        trial = study.ask()
        fn(trial)
        seen.append((trial.params["loss.tau"], trial.params["loss.tau_s"]))
        study.tell(trial, 0.0)
    assert sorted(seen) == sorted((a, b) for a in (0.05, 0.1, 0.2) for b in (0.02, 0.1))


def test_grid_searcher_refusals_say_what_to_give(tmp_path: Path) -> None:
    grid = {"name": "grid"}
    choices = {"loss.tau": {"choice": [0.05, 0.1, 0.2]}, "loss.tau_s": {"choice": [0.02, 0.1]}}
    base = {"conditional": {}, "overrides": ["loss.name=xclr"], "searcher": grid}
    with pytest.raises(ConfigError, match=r"num_samples=8 is not allowed with searcher.name="
                                          r"grid: the grid has 6 points \(3 x 2 choices\); "
                                          r"set num_samples: 6"):
        load_sweep(_write(tmp_path, space=choices, **base))
    ranged = {**choices, "optim.lr": {"loguniform": [0.01, 1.0]}}
    with pytest.raises(ConfigError, match=r"needs a choice for every parameter: optim.lr is a "
                                          r"range; list its grid values"):
        load_sweep(_write(tmp_path, space=ranged, num_samples=6, **base))
    with pytest.raises(ConfigError, match="grid is not allowed with conditional parameters"):
        load_sweep(_write(tmp_path, num_samples=6, searcher=grid))

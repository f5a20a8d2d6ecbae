"""Cluster shape vs config (issue 40, defect 9): a worker asking more CPUs (or GPUs) than any
node has is never placed, and Ray Train only says so after its start timeout, without saying
why. ``components.runtime.session.placement_problem`` gives the numbers and the fix; every example
cluster must hold every GPU config's workers (the AWS example's g5.xlarge had 4 CPUs while
the GPU reference config asks 8 a worker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from components.config import PretrainConfig, load_config
from components.runtime.session import placement_problem

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "cluster"


def _cpu(v: Any) -> float:
    s = str(v)
    return float(s[:-1]) / 1000 if s.endswith("m") else float(s)


def example_nodes() -> dict[str, list[dict[str, float]]]:
    """Every example cluster at its largest: the launchers' node types × max_workers (head
    once), the RayJob's pods × replicas (Ray reads a pod's CPU / GPU limits)."""
    out: dict[str, list[dict[str, float]]] = {}
    for name in ("aws", "gcp"):
        cfg = yaml.safe_load((CLUSTER / f"{name}.yaml").read_text())
        nodes = []
        for type_name, t in cfg["available_node_types"].items():
            count = 1 if type_name == cfg["head_node_type"] else int(t.get("max_workers", 0))
            nodes += [{k: float(v) for k, v in t["resources"].items()}] * count
        out[f"{name}.yaml"] = nodes
    job = next(d for d in yaml.safe_load_all((CLUSTER / "kuberay-rayjob.yaml").read_text())
               if d and d.get("kind") == "RayJob")
    spec = job["spec"]["rayClusterSpec"]
    nodes = []
    for group, count in [(spec["headGroupSpec"], 1),
                         *[(g, int(g["maxReplicas"])) for g in spec["workerGroupSpecs"]]]:
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        nodes += [{"CPU": _cpu(limits["cpu"]),
                   "GPU": float(limits.get("nvidia.com/gpu", 0))}] * count
    out["kuberay-rayjob.yaml"] = nodes
    return out


GPU_CONFIGS = [p for p in sorted((ROOT / "pipelines/configs/pretrain").glob("*.yaml"))
               if load_config(p, PretrainConfig, []).scaling.use_gpu]


def test_there_are_gpu_configs_and_gpu_nodes() -> None:
    assert GPU_CONFIGS and all(any(n.get("GPU", 0) >= 1 for n in nodes)
                               for nodes in example_nodes().values())


@pytest.mark.parametrize("config", GPU_CONFIGS, ids=lambda p: p.name)
@pytest.mark.parametrize("cluster", sorted(example_nodes()))
def test_every_example_cluster_holds_every_gpu_configs_workers(config: Path,
                                                               cluster: str) -> None:
    s = load_config(config, PretrainConfig, []).scaling
    problem = placement_problem(s.num_workers, s.cpus_per_worker, s.gpus_per_worker,
                                example_nodes()[cluster], f"examples/cluster/{cluster}",
                                s.placement_strategy)
    assert problem is None, problem


def test_a_worker_no_node_can_hold_is_named_with_the_numbers_and_the_fix() -> None:
    nodes = [{"CPU": 8.0}, {"CPU": 4.0, "GPU": 1.0}, {"CPU": 4.0, "GPU": 1.0}]
    msg = placement_problem(1, 8, 1, nodes, "the cluster at http://head:8265")
    assert msg is not None
    assert "1 worker(s) of 8 CPU + 1 GPU each" in msg and "holds at most 0" in msg
    assert "4 CPU / 1 GPU" in msg and "8 CPU / 0 GPU" in msg
    assert "scaling.cpus_per_worker <= 4" in msg
    assert placement_problem(2, 4, 1, nodes, "x") is None
    assert placement_problem(1, 8, 0, nodes, "x") is None  # the CPU node holds a CPU worker
    msg = placement_problem(3, 4, 1, nodes, "x")
    assert msg is not None and "holds at most 2" in msg and "Lower scaling.num_workers" in msg
    assert placement_problem(2, 1, 0, [{"CPU": 8.0}], "x", "STRICT_SPREAD") is not None
    assert placement_problem(2, 1, 0, [{"CPU": 8.0}], "x", "PACK") is None


def test_the_run_start_check_refuses_on_a_local_ray_and_warns_on_a_cluster(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import ray

    from components.config import ConfigError
    from components.runtime.session import check_placement

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "nodes", lambda: [
        {"Alive": True, "Resources": {"CPU": 2.0, "memory": 1e9}},
        {"Alive": False, "Resources": {"CPU": 64.0}}])  # a dead node holds nothing
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    check_placement(2, 1, 0)
    with pytest.raises(ConfigError, match=r"1 worker\(s\) of 8 CPU each, but this machine's "
                                          r"Ray holds at most 0 .*cpus_per_worker <= 2"):
        check_placement(1, 8, 0)
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    check_placement(1, 8, 0)  # an autoscaler may still add a node type: a warning
    out = capsys.readouterr()
    assert "the cluster at ray://head:10001 holds at most 0" in out.out + out.err


@pytest.mark.slow
def test_a_run_whose_worker_no_node_holds_is_refused_before_training(tmp_path: Path) -> None:
    """`simgraph pretrain` on a local Ray asking 64 CPUs a worker: one line with the numbers,
    exit 2, nothing trained (before: Ray Train waited for its start timeout)."""
    import subprocess
    import sys

    from tests.support.datasets import synthetic_dataset, tiny_run_config

    data = synthetic_dataset(tmp_path / "ds")
    cfg = tiny_run_config(data, tmp_path / "runs", scaling__num_workers=1,
                          scaling__cpus_per_worker=64, scaling__host="ray_train")
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = subprocess.run([sys.executable, "-m", "pipelines.cli", "pretrain", str(path)],
                       capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "1 worker(s) of 64 CPU each, but this machine's Ray holds at most 0" in r.stderr
    assert "scaling.cpus_per_worker <=" in r.stderr
    assert not list((tmp_path / "runs" / "run").glob("epoch_*"))


# ---------------------------------------------------------------------------------------------
# Train's poll on a local Ray (module docstring of components.runtime.session).


def test_a_local_ray_gives_train_the_short_poll_unless_the_variable_is_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import ray

    from components.runtime import session

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(session.TRAIN_POLL_ENV, raising=False)
    with session.ray_session(1):
        # what Train's controller actor reads: a Ray worker's environment
        seen = ray.get(ray.remote(lambda: os.environ.get(session.TRAIN_POLL_ENV)).remote())
    assert seen == session.LOCAL_TRAIN_POLL_S
    assert session.TRAIN_POLL_ENV not in os.environ  # this process's environment restored
    monkeypatch.setenv(session.TRAIN_POLL_ENV, "1.5")
    with session.local_start():
        assert os.environ[session.TRAIN_POLL_ENV] == "1.5"  # the user's value wins
    assert os.environ[session.TRAIN_POLL_ENV] == "1.5"

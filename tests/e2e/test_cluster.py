"""``simgraph submit`` against a real two-node Ray cluster (tests/support/cluster.py): loopback
only, token auth, a sweep over both nodes, and the demo pretraining with one worker per node
whose second node's raylet is killed mid-run."""

from __future__ import annotations

import csv
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from components.runs.checkpoint import is_complete
from components.runs.checkpoints import latest_complete
from tests.support.cluster import BIN, DASHBOARD, LoopbackCluster, can_make_namespaces
from tests.support.datasets import synthetic_dataset

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(can_make_namespaces() is not None,
                                 reason=str(can_make_namespaces()))]

DEMO = "pipelines/configs/pretrain/demo.yaml"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LoopbackCluster]:
    with LoopbackCluster() as c:
        c.start(workers=1)
        yield c


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The "shared filesystem": one machine, so any directory every node can see."""
    root = tmp_path_factory.mktemp("shared")
    synthetic_dataset(root / "data", size=16)  # 128 train / 32 val images, 4 classes
    return root


def submit_argv(shared: Path, name: str, *extra: str) -> list[str]:
    return [str(BIN / "simgraph"), "submit", "--address", DASHBOARD, *extra, "--", "pretrain",
            DEMO, f"name={name}", "data.dataset=data", "storage=runs", "data.batch_size=16",
            "data.augment.resolution=16", "knn.k=5", "scaling.placement_strategy=STRICT_SPREAD"]


def history(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


def workers(run_dir: Path) -> list[dict]:
    return [json.loads((run_dir / "workers" / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_loopback_only_and_token_auth(cluster: LoopbackCluster, shared: Path) -> None:
    addrs = cluster.run(["ip", "-o", "addr"]).stdout
    assert {line.split()[1] for line in addrs.splitlines()} == {"lo"}
    listening = cluster.listening()
    assert "127.0.0.1:8265" in listening  # the dashboard / Jobs API
    # Loopback or a wildcard: with only `lo` in the namespace, both mean loopback.
    hosts = {a.rsplit(":", 1)[0] for a in listening}
    assert hosts <= {"127.0.0.1", "0.0.0.0", "[::]", "*", "[::1]", "[::ffff:127.0.0.1]"}, hosts
    nodes = cluster.nodes()
    assert len(nodes) == 2 and {n["node_ip"] for n in nodes} == {"127.0.0.1"}
    # A client with another token is turned away before anything runs.
    env = {**cluster.env, "RAY_AUTH_TOKEN": "0" * 64}
    env.pop("RAY_AUTH_TOKEN_PATH")
    p = cluster.run([*submit_argv(shared, "nope", "--base-dir", str(shared), "--no-wait")],
                    check=False, env=env, timeout=120)
    assert p.returncode != 0
    assert "token" in (p.stdout + p.stderr).lower()
    assert not (shared / "runs" / "nope").exists()


def test_submit_sweep_over_both_nodes(cluster: LoopbackCluster, shared: Path) -> None:
    """A shipped search space, trials whose workers are spread over the nodes: each trial
    actor re-roots the space's path in its own node's copy of the project."""
    overrides = ("[loss.name=xclr, loss.graph=class, train.epochs=2, data.dataset=data, "
                 "data.batch_size=16, data.augment.resolution=16, knn.k=5, "
                 "scaling.placement_strategy=STRICT_SPREAD]")
    p = cluster.run([str(BIN / "simgraph"), "submit", "--address", DASHBOARD, "--base-dir",
                     str(shared), "--", "sweep", "search_spaces/xclr_temperature.yaml",
                     "name=spread-sweep", "storage=sweeps", "num_samples=2",
                     "scheduler.grace_period=1", f"overrides={overrides}"], timeout=600)
    assert "SUCCEEDED" in p.stdout, p.stdout[-3000:]
    sweep_dir = shared / "sweeps" / "spread-sweep"
    with open(sweep_dir / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["finished", "finished"], rows
    alive = {n["node_id"] for n in cluster.nodes()}
    for trial in (t for t in (sweep_dir / "trials").iterdir()
                  if t.is_dir()):  # beside each: its run dir's lock, .<trial>.lock
        assert {x["node_id"] for x in workers(trial)} == alive
        done = latest_complete(trial)
        assert done is not None and done[0] == 2
    assert (sweep_dir / "best.yaml").exists()


def test_submitted_preprocess_into_a_folder_only_the_head_sees(
        cluster: LoopbackCluster, shared: Path) -> None:
    """A dataset built where the second node has a folder of its own at the same path (its
    own disk, as a URI output's local build dir is): the build's tasks and caption actors run
    where the build dir is, not on a node whose writes the driver would never see (before:
    "shard … did not complete" on every re-run, or caption rows left as zeros)."""
    out = cluster.private / "demo"
    p = cluster.run([str(BIN / "simgraph"), "submit", "--address", DASHBOARD, "--base-dir",
                     str(shared), "--", "preprocess", "pipelines/configs/data/demo.yaml",
                     f"output={out}", "source.max_per_class=12", "shard_size=20"], timeout=600)
    assert "SUCCEEDED" in p.stdout, p.stdout[-3000:]
    assert "simgraph preprocess: building on 1 of 2 nodes (1 CPUs)" in p.stdout, p.stdout
    assert f"{out} is not there" in p.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert {k: v["samples"] for k, v in manifest["splits"].items()} == {
        "train": 110, "val": 10, "test": 120}
    table = np.load(out / "caption_embeddings.npy")  # every row written, by the actors
    assert table.shape == (10, 384)
    np.testing.assert_allclose(np.linalg.norm(table, axis=1), 1.0, atol=1e-4)


def test_submitted_run_spreads_over_the_nodes_and_resumes_when_a_killed_raylet_returns(
        cluster: LoopbackCluster, shared: Path, tmp_path: Path) -> None:
    """The demo pretraining submitted with one worker per node (STRICT_SPREAD), the code the
    job shipped, started from a ``model.init`` file (its bytes reach the workers through the
    object store: the driver's node need not share it); the second node's raylet SIGKILLed
    after epoch 2's checkpoint: the worker group restarts from it once a node returns, and the
    run ends with every epoch once."""
    from safetensors.torch import save_file

    from components.config import PretrainConfig, load_config
    from components.models.encoders import build_encoder

    run_dir = shared / "runs" / "failover"
    log = tmp_path / "submit.log"
    demo = load_config(ROOT / DEMO, PretrainConfig)
    save_file(build_encoder(demo.model, 16).backbone.state_dict(), str(shared / "init.safetensors"))
    # 4 steps per epoch: every rank pauses before step 9, i.e. after epoch 2's checkpoint.
    proc = cluster.popen([*submit_argv(shared, "failover", "--base-dir", str(shared),
                                       "--env", "SIMGRAPH_PAUSE_AT_STEP=9"),
                          "train.epochs=4", "scaling.max_failures=3",
                          "model.init=init.safetensors"], log)
    try:
        flags = [run_dir / "workers" / f"paused-rank{r}-step9" for r in (0, 1)]
        cluster.wait(lambda: all(f.exists() for f in flags) or proc.poll() is not None, 300,
                     "both ranks to pause after epoch 2")
        assert proc.poll() is None, log.read_text()[-3000:]
        nodes = cluster.nodes()
        lost = next(n["node_id"] for n in nodes if not n["is_head_node"])
        before = workers(run_dir)
        assert {x["node_id"] for x in before} == {n["node_id"] for n in nodes}  # one per node
        assert [x["node_rank"] for x in before] == [0, 1]
        assert [x["local_rank"] for x in before] == [0, 0]
        # Ray Train ranks nodes by IP: both nodes share 127.0.0.1, so both are its node 0.
        assert [x["ray_node_rank"] for x in before] == [0, 0]
        assert all(x["device"] == "cpu" for x in before)
        # The code that ran is the job's shipped working_dir, not this checkout.
        assert all(x["code"] != str(ROOT) and "working_dir" in x["code"] for x in before), before
        os.kill(cluster.raylets()["ray-node1"], signal.SIGKILL)
        cluster.wait(lambda: lost not in {n["node_id"] for n in cluster.nodes()}, 120,
                     "the cluster to see the node die")
        cluster.add_node()  # capacity returns: the worker group restarts from epoch 2
        assert proc.wait(timeout=400) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log.read_text()
    assert "SUCCEEDED" in out and "resumed 'failover' after epoch 2" in out
    assert f"[simgraph] initialised from {shared / 'init.safetensors'}: " in out, out[-3000:]
    assert [r["epoch"] for r in history(run_dir)] == ["1", "2", "3", "4"]
    ckpts = sorted(run_dir.glob("epoch_*"))
    assert ckpts and all(is_complete(d) for d in ckpts), ckpts  # nothing half-written kept
    done = latest_complete(run_dir)
    assert done is not None and done[0] == 4
    w = workers(run_dir)
    assert lost not in {x["node_id"] for x in w} and w[0]["node_id"] != w[1]["node_id"]
    assert {x["node_id"] for x in w} == {n["node_id"] for n in cluster.nodes()}
    assert (run_dir / "config.yaml").exists()

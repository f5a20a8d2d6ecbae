"""``simgraph submit`` without a cluster: the command checks, the runtime env, path rules, and
node ranks from node ids (the two-node cluster itself is tests/e2e/test_cluster.py)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from components.deploy.cluster import entrypoint
from components.deploy.jobs import SubmitError
from components.deploy.package import EXCLUDES, project_requirements, runtime_env
from components.io.paths import (
    BASE_ENV,
    is_relative,
    localize,
    portable,
    project_root,
    resolve_path,
)
from components.runtime.distributed import node_layout

ROOT = project_root()
DEMO = "pipelines/configs/pretrain/demo.yaml"


def _prepare(job: list[str], base_dir: str | None, root: Path | None = None) -> list[str]:
    """``simgraph submit``'s check of the job, with the CLI's own parser."""
    from components.deploy.jobs import prepare_command
    from pipelines.cli import build_parser

    return prepare_command(job, base_dir, build_parser(), root)


def test_relative_data_paths_need_a_base_dir() -> None:
    with pytest.raises(SubmitError, match=r"storage=runs, data\.dataset=data/demo.*--base-dir"):
        _prepare(["--", "pretrain", DEMO], None)
    argv = _prepare(["--", "pretrain", DEMO], "/shared/simgraph")
    assert argv == ["pretrain", DEMO]
    absolute = _prepare(["pretrain", DEMO, "storage=s3://b/runs",
                                "data.dataset=/shared/data/demo"], None)
    assert absolute[-2:] == ["storage=s3://b/runs", "data.dataset=/shared/data/demo"]


@pytest.mark.parametrize("base", ["shared", "s3://bucket/x"])
def test_base_dir_must_be_an_absolute_shared_path(base: str) -> None:
    with pytest.raises(SubmitError, match="--base-dir .* absolute path"):
        _prepare(["pretrain", DEMO], base)


def test_every_command_kind_is_checked(tmp_path: Path) -> None:
    # run: the preprocess output and every run's storage.
    with pytest.raises(SubmitError, match=r"output=data/demo.*demo-supcon|simclr: storage"):
        _prepare(["run", "pipelines/configs/demo.yaml"], None)
    # sweep: its storage and the base config's dataset.
    with pytest.raises(SubmitError, match=r"storage=runs/sweeps"):
        _prepare(["sweep", "search_spaces/xclr_temperature.yaml"], None)
    with pytest.raises(SubmitError, match=r"RUN_DIR=runs/a"):
        _prepare(["evaluate", "runs/a", "/abs/b"], None)
    assert _prepare(["evaluate", "/abs/a"], None) == ["evaluate", "/abs/a"]
    # Configs are loaded and validated here, before anything is sent.
    with pytest.raises(SubmitError, match=r"invalid config.*loss\.tau"):
        _prepare(["pretrain", DEMO, "loss.tau=-1"], "/shared")


def test_bad_commands_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SubmitError, match="no command to submit"):
        _prepare(["--"], None)
    with pytest.raises(SubmitError, match="cannot submit 'submit'.*one of"):
        _prepare(["submit", "--", "pretrain", DEMO], None)
    with pytest.raises(SubmitError, match="not a valid command"):
        _prepare(["sweep"], None)
    outside = tmp_path / "mine.yaml"
    outside.write_text((ROOT / DEMO).read_text())
    with pytest.raises(SubmitError, match="outside the project dir"):
        _prepare(["pretrain", str(outside)], "/shared")
    with pytest.raises(SubmitError, match="does not exist"):
        _prepare(["pretrain", "nope.yaml"], "/shared")
    # A shipped search space whose base config is not shipped.
    space = ROOT / "search_spaces" / "xclr_temperature.yaml"
    text = space.read_text().replace("base: ../pipelines/configs/pretrain/demo.yaml",
                                     f"base: {outside}")
    inside = ROOT / "search_spaces" / f".test-{tmp_path.name}.yaml"
    inside.write_text(text)
    try:
        with pytest.raises(SubmitError, match="mine.yaml is outside the project dir"):
            _prepare(["sweep", str(inside)], "/shared")
    finally:
        inside.unlink()


def test_config_paths_become_project_relative(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT / "pipelines")  # the job starts in the project's root, not here
    argv = _prepare(["pretrain", "configs/pretrain/demo.yaml", "name=x"], "/s")
    assert argv == ["pretrain", DEMO, "name=x"]
    assert entrypoint(argv) == "python -m pipelines.cli pretrain " + shlex.join(argv[1:])


def test_runtime_env_ships_the_project() -> None:
    env = runtime_env(ROOT, base_dir="/shared", env=["A=1", "B=x=y"])
    assert env["working_dir"] == str(ROOT) and env["excludes"] == EXCLUDES
    assert {"/.venv", "/.git", "/runs/", "/data/"} <= set(env["excludes"])
    assert env["env_vars"] == {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
                               BASE_ENV: "/shared", "A": "1", "B": "x=y"}
    assert "pip" not in env
    pip = runtime_env(ROOT, pip="project")["pip"]
    assert pip == project_requirements(ROOT)
    names = {shlex.split(p)[0].split("=")[0].split("[")[0].split(">")[0] for p in pip}
    assert {"torch", "torchvision", "optuna", "pyyaml"} <= names
    assert not names & {"ray", "ffcv"}  # the cluster's own (version match / apt build deps)
    merged = runtime_env(ROOT, env=["A=1"], extra={"env_vars": {"C": 3}, "excludes": ["big/"],
                                                   "conda": "x"})
    assert merged["env_vars"]["C"] == "3" and merged["env_vars"]["A"] == "1"
    assert merged["excludes"][-1] == "big/" and merged["conda"] == "x"
    with pytest.raises(SubmitError, match="KEY=VALUE"):
        runtime_env(ROOT, env=["nokey"])
    with pytest.raises(SubmitError, match="none or project"):
        runtime_env(ROOT, pip="all")


def test_paths_against_the_base_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(BASE_ENV, raising=False)
    assert resolve_path("runs") == str(tmp_path / "runs")
    monkeypatch.setenv(BASE_ENV, "/shared/sg")
    assert resolve_path("runs/a") == "/shared/sg/runs/a"
    assert resolve_path("/abs") == "/abs" and resolve_path("s3://b/k?x=1") == "s3://b/k?x=1"
    assert resolve_path("runs", base="/other") == "/other/runs"
    assert is_relative("runs") and not is_relative("~/x") and not is_relative("gs://b/x")
    assert not is_relative("/x")


def test_portable_paths_re_root_on_each_node(tmp_path: Path) -> None:
    space = ROOT / "search_spaces" / "xclr_temperature.yaml"
    assert portable(space) == "project:search_spaces/xclr_temperature.yaml"
    assert localize(portable(space)) == space
    assert portable(tmp_path / "s.yaml") == str(tmp_path / "s.yaml")
    assert localize(str(tmp_path)) == tmp_path


@pytest.mark.parametrize(("nodes", "expect"), [
    # Two nodes that share one IP: Ray Train would call both node 0, local ranks 0 and 1.
    (["a", "b"], [(0, 0, 1), (1, 0, 1)]),
    (["a", "a", "b", "b"], [(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]),
    # Ranks interleaved over nodes: node order follows each node's lowest rank.
    (["b", "a", "b"], [(0, 0, 2), (1, 0, 1), (0, 1, 2)]),
])
def test_node_layout_from_node_ids(nodes: list[str], expect: list[tuple[int, int, int]]) -> None:
    got = [node_layout(nodes, r) for r in range(len(nodes))]
    assert [(g["node_rank"], g["local_rank"], g["local_world_size"]) for g in got] == expect
    assert {g["num_nodes"] for g in got} == {len(set(nodes))}


def test_excludes_ship_every_source_file_and_no_outputs(tmp_path: Path) -> None:
    """Ray matches ``excludes`` with gitignore rules relative to the working_dir (its own
    packaging helper decides here), and leaves out what the repo's ``.gitignore`` ignores: the
    code ships, the venv / data / runs do not."""
    from ray._private.runtime_env.packaging import _get_excludes, get_excludes_from_ignore_files

    excluded = _get_excludes(ROOT, EXCLUDES)
    ignored = get_excludes_from_ignore_files(ROOT, include_gitignore=True)
    sources = [p for d in ("components", "pipelines", "search_spaces")
               for p in (ROOT / d).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert any(p.parent.name == "data" for p in sources)  # components/data/*.py
    assert any(p.parent.name == "build" for p in sources)  # components/data/build/*.py
    assert not [p for p in sources if excluded(p) or any(ign(p) for ign in ignored)]
    for out in (".venv/bin/python", "data/demo/train.beton", "runs/a/config.yaml",
                ".git/HEAD", "components/x.beton"):
        assert excluded(ROOT / out), out


def test_ray_maps_gpus_per_node_id_even_when_nodes_share_an_ip(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The device simgraph trains on is Ray's (``ray.train.torch.get_device``): the worker's
    GPU ids within the ``CUDA_VISIBLE_DEVICES`` that Ray Train sets per *node id* — never a
    local rank. Two 2-GPU nodes behind one IP: Ray Train's local ranks (by IP) run 0..3, and
    ``cuda:<local rank>`` would name GPUs 2 and 3 that the second node lacks; the devices and
    simgraph's node-id local ranks are 0, 1, 0, 1."""
    from types import SimpleNamespace

    import ray
    from ray.air._internal.device_manager.nvidia_gpu import CUDATorchDeviceManager
    from ray.train.v2._internal.callbacks.accelerators import (
        _get_visible_accelerator_ids_per_worker,
    )

    workers = [SimpleNamespace(node_id=n, node_ip="127.0.0.1", accelerator_ids={"GPU": [g]})
               for n, g in (("a", "0"), ("a", "1"), ("b", "0"), ("b", "1"))]
    visible = _get_visible_accelerator_ids_per_worker(workers, "GPU")  # type: ignore[arg-type]
    assert visible == ["0,1", "0,1", "0,1", "0,1"]
    devices = []
    for w, v in zip(workers, visible, strict=True):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", v)
        monkeypatch.setattr(ray, "get_gpu_ids", lambda w=w: w.accelerator_ids["GPU"])
        devices += [str(d) for d in CUDATorchDeviceManager().get_devices()]
    assert devices == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    layout = [node_layout([w.node_id for w in workers], r) for r in range(4)]
    assert [f"cuda:{x['local_rank']}" for x in layout] == devices
    by_ip = [node_layout([w.node_ip for w in workers], r) for r in range(4)]
    assert [x["local_rank"] for x in by_ip] == [0, 1, 2, 3]  # what ranking by IP gives


# ---------------------------------------------------------------------------------------------
# The workers' shape against the cluster's nodes, before the job leaves (issue 40).

GPU_CONFIG = "pipelines/configs/pretrain/fashion_mnist_resnet18.yaml"  # 1 worker, 8 CPU + 1 GPU


def _node(cpus: float, gpus: float = 0.0, state: str = "ALIVE") -> Any:
    """A node as Ray 2.60's ``list_nodes`` returns it: the State API's answer (recorded from a
    local Ray's ``GET /api/v0/nodes``) in Ray's own ``NodeState``."""
    from ray.util.state.common import NodeState

    resources = {"CPU": cpus, "memory": 23773298688.0, "node:127.0.0.1": 1.0,
                 "object_store_memory": 1073741824.0, **({"GPU": gpus} if gpus else {})}
    return NodeState(node_id="9e8e114d", node_ip="127.0.0.1", is_head_node=False, state=state,
                     state_message=None, node_name="127.0.0.1", resources_total=resources,
                     labels={"ray.io/node-id": "9e8e114d"})


def _send(monkeypatch: pytest.MonkeyPatch, nodes: Any, *job: str) -> tuple[int, dict[str, Any],
                                                                           list[str]]:
    """`simgraph submit --no-wait -- JOB` against a stand-in cluster: Ray's job client records
    what would be sent; Ray's ``list_nodes`` (the State API call) answers ``nodes``, or raises
    it when it is an exception. Returns the exit status, what was submitted, and the
    addresses the node listing was asked at."""
    import ray.job_submission
    import ray.util.state

    from pipelines import cli

    sent: dict[str, Any] = {}
    asked: list[str] = []

    class Client:
        def __init__(self, address: str) -> None:
            pass

        def submit_job(self, **kw: Any) -> str:
            sent.update(kw)
            return str(kw["submission_id"])

    def list_nodes(address: str | None = None, **kw: Any) -> Any:
        asked.append(str(address))
        if isinstance(nodes, BaseException):
            raise nodes
        return nodes

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", Client)
    monkeypatch.setattr(ray.util.state, "list_nodes", list_nodes)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    rc = cli.main(["submit", "--no-wait", "--address", "http://head:8265", "--base-dir",
                   "/shared", "--", *job])
    return rc, sent, asked


def test_submit_refuses_workers_no_node_holds_and_sends_nothing(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The GPU reference config (8 CPUs + 1 GPU a worker) against a head of 8 CPUs and two
    4-CPU GPU nodes (issue 40 defect 9's g5.xlarge): refused with the numbers and the fix, exit
    2, nothing submitted. A dead node holds nothing."""
    monkeypatch.delenv("SIMGRAPH_SUBMIT_UNPLACED", raising=False)
    nodes = [_node(8), _node(4, 1), _node(4, 1), _node(64, 8, state="DEAD")]
    rc, sent, asked = _send(monkeypatch, nodes, "pretrain", GPU_CONFIG)
    err = capsys.readouterr().err
    assert rc == 2 and not sent, err
    assert asked == ["http://head:8265"]
    assert ("simgraph submit: pretrain: scaling asks 1 worker(s) of 8 CPU + 1 GPU each, but the "
            "cluster at http://head:8265 holds at most 0 (its nodes: 4 CPU / 1 GPU, 8 CPU / 0 "
            "GPU): the run could never start. Set scaling.cpus_per_worker <= 4 (and "
            "data.num_workers with it), or add nodes with more CPUs. Nothing was sent") in err
    assert "SIMGRAPH_SUBMIT_UNPLACED=warn" in err and len(err.strip().splitlines()) == 1
    # A cluster whose autoscaler adds the node type later: told so, the job goes.
    monkeypatch.setenv("SIMGRAPH_SUBMIT_UNPLACED", "warn")
    rc, sent, _ = _send(monkeypatch, nodes, "pretrain", GPU_CONFIG)
    err = capsys.readouterr().err
    assert rc == 0 and sent["entrypoint"].endswith(f"pretrain {GPU_CONFIG}")
    assert "warning: pretrain: scaling asks 1 worker(s) of 8 CPU + 1 GPU" in err


def test_submit_sends_workers_the_nodes_hold(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SIMGRAPH_SUBMIT_UNPLACED", raising=False)
    rc, sent, asked = _send(monkeypatch, [_node(8), _node(8, 1)], "pretrain", GPU_CONFIG)
    assert rc == 0 and asked and sent["entrypoint"].endswith(f"pretrain {GPU_CONFIG}")
    # The fix the refusal names fits the small GPU nodes.
    rc, sent, _ = _send(monkeypatch, [_node(8), _node(4, 1)], "pretrain", GPU_CONFIG,
                        "scaling.cpus_per_worker=4", "data.num_workers=4")
    assert rc == 0 and sent, capsys.readouterr().err
    # A command without a worker group asks the cluster nothing.
    rc, sent, asked = _send(monkeypatch, RuntimeError("not asked"), "evaluate", "/shared/runs/a")
    assert rc == 0 and sent and not asked


def test_submit_warns_in_one_line_and_sends_when_the_cluster_cannot_be_asked(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A dashboard without the State API answers 404, which Ray's client raises as this."""
    from ray.util.state.exception import RayStateApiException

    old = RayStateApiException("Failed to parse Response(url=http://head:8265/api/v0/nodes?"
                               "limit=10000, status=404, text='404: Not Found')")
    rc, sent, asked = _send(monkeypatch, old, "pretrain", GPU_CONFIG)
    err = capsys.readouterr().err
    assert rc == 0 and sent and asked
    warning = [ln for ln in err.splitlines() if "cannot list the nodes" in ln]
    assert warning == [
        "simgraph submit: warning: cannot list the nodes of the cluster at http://head:8265 "
        "(RayStateApiException: Failed to parse Response(url=http://head:8265/api/v0/nodes?"
        "limit=10000, status=404, text='404: Not Found')); the workers' shape is checked when "
        "the run starts"]


def test_the_worker_groups_each_command_asks_for() -> None:
    from components.deploy.jobs import WorkerShape, prepare_job
    from pipelines.cli import build_parser

    def shapes(*job: str) -> list[WorkerShape]:
        return prepare_job(list(job), "/shared", build_parser()).shapes

    assert shapes("pretrain", GPU_CONFIG) == [
        WorkerShape(what="pretrain", workers=1, cpus=8.0, gpus=1.0, strategy="PACK")]
    assert shapes("pretrain", GPU_CONFIG, "scaling.num_workers=4",
                  "scaling.placement_strategy=STRICT_SPREAD") == [
        WorkerShape(what="pretrain", workers=4, cpus=8.0, gpus=1.0, strategy="STRICT_SPREAD")]
    # A CPU run: no GPUs asked (scaling.gpus_per_worker is unused without use_gpu).
    assert shapes("pretrain", DEMO, "scaling.host=ray_train")[0].gpus == 0.0
    # Trained in the job's own process: nothing to place.
    assert shapes("pretrain", DEMO, "scaling.host=in_process", "scaling.num_workers=1") == []
    run = shapes("run", "pipelines/configs/demo.yaml")
    assert run and all(s.what.startswith("run ") for s in run)
    sweep = shapes("sweep", "search_spaces/across_losses.yaml")
    assert [(s.workers, s.cpus, s.gpus) for s in sweep] == [(2, 0.5, 0.0)]
    assert sweep[0].what.startswith("sweep trials")
    assert shapes("validate", DEMO) == [] and shapes("evaluate", "/abs/a") == []

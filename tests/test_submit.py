"""``simgraph submit`` without a cluster: the command checks, the runtime env, path rules, and
node ranks from node ids (the two-node cluster itself is tests/test_cluster.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from components.distributed import node_layout
from components.paths import BASE_ENV, is_relative, localize, portable, project_root, resolve_path
from pipelines.submit import (
    EXCLUDES,
    SubmitError,
    entrypoint,
    project_requirements,
    runtime_env,
)

ROOT = project_root()
DEMO = "pipelines/configs/pretrain/demo.yaml"


def _prepare(job: list[str], base_dir: str | None, root: Path | None = None) -> list[str]:
    """``simgraph submit``'s check of the job, with the CLI's own parser."""
    from pipelines.cli import build_parser
    from pipelines.submit import prepare_command

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

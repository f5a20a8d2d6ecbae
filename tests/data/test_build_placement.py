"""Which nodes a build runs on (``components/data/build/placement.py``): the probe's verdict
on one node, the choice from every node's verdict, and the pinned task / actor options. The
probe on a real two-node cluster whose second node has its own folder at the build dir's path:
``tests/e2e/test_cluster.py::test_submitted_preprocess_into_a_folder_only_the_head_sees``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from components.data.build import placement as pl
from components.data.build.common import PreprocessError
from components.data.build.tasks import _task_count

A = pl.Node("a" * 56, "10.0.0.1", cpus=2, gpus=0)
B = pl.Node("b" * 56, "10.0.0.2", cpus=1, gpus=1)
HEAD0 = pl.Node("c" * 56, "10.0.0.3", cpus=0, gpus=0)


def test_a_node_sees_the_build_only_with_the_same_token_and_the_same_source_files(
        tmp_path: Path) -> None:
    token = tmp_path / ".placement-x"
    token.write_text("t0k3n")
    img = tmp_path / "img.jpg"
    img.write_bytes(b"\xff\xd8jpeg")
    files = pl._source_files([str(img), "s3://bucket/a.jpg"])  # a URI: read alike anywhere
    assert files == {str(img): (6, os.stat(img).st_mtime_ns)}
    assert pl.sees(str(token), "t0k3n", files) is None
    assert pl.sees(str(token), "other", files) == f"{tmp_path} is another folder here"
    assert pl.sees(str(tmp_path / "gone" / ".placement-x"), "t0k3n", files) == (
        f"{tmp_path / 'gone'} is not there")
    img.write_bytes(b"\xff\xd8a different jpeg")  # the node's copy of the source differs
    assert pl.sees(str(token), "t0k3n", files) == f"the source file {img} is missing or differs"


def test_every_node_seeing_the_build_leaves_it_anywhere(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    assert pl.choose([A, B], {}, Path("/out"), echo=True) is pl.ANYWHERE
    assert capsys.readouterr().out == ""


def test_a_node_that_does_not_see_the_build_is_left_out_and_the_user_told(
        capsys: pytest.CaptureFixture[str]) -> None:
    got = pl.choose([A, B, HEAD0], {B.node_id: "/out is not there"}, Path("/out"), echo=True)
    assert got == pl.Placement((A,))  # HEAD0 sees it but has no CPU
    out = capsys.readouterr().out
    assert out.startswith("simgraph preprocess: building on 1 of 3 nodes (2 CPUs), the others "
                          "do not see it (node 10.0.0.2 (bbbbbbbb): /out is not there); ")
    assert "$SIMGRAPH_STAGE_DIR" in out and "every node mounts" in out


def test_no_node_with_a_cpu_seeing_the_build_is_an_error_naming_them() -> None:
    with pytest.raises(PreprocessError) as e:
        pl.choose([HEAD0, A], {A.node_id: "/out is not there"}, Path("/out"), echo=False)
    msg = str(e.value)
    assert "no node with a CPU sees the build dir /out" in msg
    assert "the nodes that do have no CPUs: 10.0.0.3" in msg
    assert "node 10.0.0.1 (aaaaaaaa): /out is not there" in msg
    assert "every node mounts at the same path" in msg


def test_pinned_tasks_go_round_robin_by_cpus_and_actors_to_the_gpu_node() -> None:
    p = pl.Placement((A, B))
    picked = [p.task_options(k)["scheduling_strategy"] for k in range(6)]
    assert [s.node_id[0] for s in picked] == list("aabaab")
    assert all(s.soft is False for s in picked)
    assert p.actor_options(gpu=True)["scheduling_strategy"].node_id == B.node_id
    assert p.actor_options(gpu=False)["scheduling_strategy"].node_id == A.node_id
    assert (p.cpus(), p.gpus()) == (3, 1)
    assert _task_count(1000, p) == 12  # 4 per CPU of the pinned nodes
    assert pl.ANYWHERE.task_options(0) == {} and pl.ANYWHERE.actor_options(True) == {}


def test_one_node_is_not_probed_and_a_killed_builds_token_is_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".placement-dead").write_text("left by a killed build")
    monkeypatch.setattr(pl, "alive_nodes", lambda: [A])
    monkeypatch.setattr(pl, "probe", lambda *a: pytest.fail("probed a single node"))
    assert pl.decide(tmp_path, ["/x.jpg"]) is pl.ANYWHERE
    assert list(tmp_path.iterdir()) == []


def test_the_near_duplicate_search_in_the_builds_ray_tasks_plans_the_same(
        tmp_path: Path, ray_local: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """From ``NEAR_TASKS_MIN`` kept items (here: any) a plan given the build's placement
    searches the near-duplicate keys in Ray tasks (two per CPU, the hashes in the object
    store): the same rows, splits and near-duplicate report as the search in the driver."""
    from components.data.build import planning
    from tests.data.test_integrity import _cfg, _collection

    _collection(tmp_path / "src")
    cfg = _cfg(tmp_path, tmp_path / "src", captions__enabled=False, split__val=0.3,
               split__test=0.3)
    here = planning.plan(cfg)
    ran: list[tuple[str, int]] = []
    real = planning.iter_tasks

    def spy(fn: object, args: list[object], **kwargs: object) -> object:
        ran.append((getattr(fn, "__name__", ""), len(args)))
        return real(fn, args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(planning, "iter_tasks", spy)
    monkeypatch.setattr(planning, "NEAR_TASKS_MIN", 0)
    spread = planning.plan(cfg, placement=pl.ANYWHERE)
    assert ran == [("key_pairs", 4)]  # 2 CPUs: 4 groups of keys
    assert spread.rows == here.rows and spread.near_duplicates == here.near_duplicates
    assert here.near_duplicates is not None and here.near_duplicates["pairs"] >= 1
    monkeypatch.setattr(planning, "NEAR_TASKS_MIN", 10**9)  # below it: in the driver
    assert planning.plan(cfg, placement=pl.ANYWHERE).rows == here.rows and len(ran) == 1

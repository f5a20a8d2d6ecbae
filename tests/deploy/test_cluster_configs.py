"""examples/cluster/ offline: the cluster-launcher YAMLs pass the installed Ray's schema and the
config preparation `ray up` does before it contacts a cloud, install what `make setup` installs
with pyproject.toml's pins, give GPU node types a GPU and start head and workers on one port in
token mode; the RayJob is complete; every simgraph command in these files (entrypoint, commented
usage, README) parses with the real CLI and its config files load."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import ray.autoscaler
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from components.search_space import load_sweep
from pipelines import cli

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "cluster"
YAMLS = sorted(CLUSTER.glob("*.yaml"))
LAUNCHERS = ["aws", "gcp"]
OPTIONAL_APT = {"dataset-fashion-mnist"}  # data for the built-in source, not an ffcv build dep
SEPARATORS = {"&&", "||", ";", "|"}


def _docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _launcher(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((CLUSTER / f"{name}.yaml").read_text()))


def _rayjob() -> dict[str, Any]:
    jobs = [d for d in _docs(CLUSTER / "kuberay-rayjob.yaml") if d.get("kind") == "RayJob"]
    assert len(jobs) == 1
    return jobs[0]


def _pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    found = (re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?==(\S+)", d.strip()) for d in deps)
    return {m.group(1).lower(): m.group(3) for m in found if m}


def _segments(command: str) -> Iterator[tuple[dict[str, str], list[str]]]:
    """(leading VAR=value assignments, argv) of each simple command of a shell line."""
    tokens = shlex.split(command.replace(";", " ; "), comments=True)
    env: dict[str, str] = {}
    argv: list[str] = []
    for tok in [*tokens, ";"]:
        if tok in SEPARATORS:
            if argv:
                yield env, argv
            env, argv = {}, []
        elif not argv and re.fullmatch(r"[A-Za-z_]\w*=\S*", tok):
            env[tok.partition("=")[0]] = tok.partition("=")[2]
        else:
            argv.append(tok)


def _ray_start(commands: list[str]) -> dict[str, str]:
    """Flags of the one `ray start` in ``commands``, and ``env:NAME`` for assignments before it."""
    found = [{**{f"env:{k}": v for k, v in env.items()},
              **{k: v for k, _, v in (t.partition("=") for t in argv[2:])}}
             for c in commands for env, argv in _segments(c) if argv[:2] == ["ray", "start"]]
    assert len(found) == 1, commands
    return found[0]


def check_simgraph(argv: list[str]) -> None:
    """``simgraph ARGV`` parses with the real CLI and the files it names load and validate."""
    try:
        args = cli.build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"not a valid simgraph command: {shlex.join(argv)}")
    if args.command == "submit":
        from components.deploy.jobs import prepare_command

        with contextlib.chdir(ROOT):  # what `simgraph submit` checks before it sends the job
            prepare_command(args.job, args.base_dir, cli.build_parser())
        check_simgraph(args.job[1:] if args.job[:1] == ["--"] else args.job)
    elif args.command == "sweep":
        assert (ROOT / args.space).is_file(), args.space
        load_sweep(ROOT / args.space, args.overrides)  # raises ConfigError, naming the problem
    elif args.command in ("validate", "preprocess", "pretrain", "run"):
        assert (ROOT / args.config).is_file(), args.config
        assert cli.validate(str(ROOT / args.config), args.overrides) == 0, argv


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict | list):
        for value in node.values() if isinstance(node, dict) else node:
            yield from _strings(value)


def _shown_commands(text: str, fenced: bool) -> list[str]:
    """Commands shown to users: in a README, fenced code lines; in a YAML, comment lines
    indented by 2+ spaces after '#'. A line ending in a backslash continues on the next."""
    code, in_fence, shell = [], False, True
    for line in text.splitlines():
        if fenced and line.startswith("```"):
            in_fence = not in_fence
            shell = line[3:].strip() in ("", "bash", "sh", "console")  # not ```text, ```yaml
        elif fenced and in_fence and shell:
            code.append(line.strip())
        elif not fenced and (m := re.match(r"\s*#\s{2,}(\S.*)", line)):
            code.append(m.group(1).strip())
    return "\n".join(code).replace("\\\n", " ").splitlines()


# ---------------------------------------------------------------------------------------------


def test_every_cluster_file_parses() -> None:
    assert {p.stem for p in YAMLS} == {"aws", "gcp", "kuberay-rayjob"}
    for path in YAMLS:
        docs = _docs(path)
        assert docs and all(isinstance(d, dict) for d in docs), path


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_passes_rays_schema_and_config_preparation(name: str) -> None:
    cfg = _launcher(name)
    schema_path = Path(ray.autoscaler.__file__).parent / "ray-schema.json"
    jsonschema.validate(cfg, json.loads(schema_path.read_text()))
    assert cfg["provider"]["type"] == name
    # What `ray up` does before bootstrapping the provider (which needs the cloud).
    prepared = prepare_config(copy.deepcopy(cfg))
    validate_config(prepared)
    assert prepared["head_setup_commands"][: len(cfg["setup_commands"])] == cfg["setup_commands"]


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_setup_mirrors_make_setup(name: str) -> None:
    cfg = _launcher(name)
    setup = cfg["setup_commands"]
    apt = [seg for c in setup for _, seg in _segments(c) if "apt-get" in seg[:3]]
    assert any("update" in seg for seg in apt), "no apt-get update"
    installed = {t for seg in apt if "install" in seg for t in seg if not t.startswith("-")}
    makefile = re.search(r"^APT_PKGS\s*:?=\s*(.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert makefile, "Makefile has no APT_PKGS"
    missing = set(makefile.group(1).split()) - OPTIONAL_APT - installed
    assert not missing, f"apt packages ffcv builds against are not installed: {missing}"
    pip = [seg for c in [*setup, *cfg["head_setup_commands"]] for _, seg in _segments(c)
           if seg[0].endswith("pip") and "install" in seg]
    assert len({seg[0] for seg in pip}) == 1, "pip installs go to more than one environment"
    venv_bin = str(Path(pip[0][0]).parent).replace("~", "$HOME")
    assert any(venv_bin in c and "PATH" in c for c in setup), "`ray` must run from that env"
    pins, pinned = _pins(), {}
    for seg in pip:
        for tok in seg:
            pkg, sep, version = tok.partition("==")
            if sep:
                assert pins.get(pkg.lower()) == version, f"{tok} vs pyproject.toml"
                pinned[pkg.lower()] = (pip.index(seg), "--no-build-isolation" in seg)
    assert {"numpy", "ffcv"} <= set(pinned)
    assert pinned["numpy"][0] < pinned["ffcv"][0], "ffcv builds against the installed numpy"
    assert pinned["ffcv"][1], "ffcv needs --no-build-isolation to build against that numpy"
    project = [remote for remote, local in cfg["file_mounts"].items() if local in (".", "./")]
    assert project, "file_mounts must copy the repository ('.')"
    assert any(seg[-2:] == ["-e", project[0]] for seg in pip), "no `pip install -e` of the project"


def test_launcher_gpu_workers() -> None:
    aws, gcp = _launcher("aws"), _launcher("gcp")
    for cfg in (aws, gcp):
        head = cfg["available_node_types"][cfg["head_node_type"]]
        assert not head["resources"].get("GPU")
        workers = [t for n, t in cfg["available_node_types"].items() if n != cfg["head_node_type"]]
        assert workers and all(t["min_workers"] == 0 for t in workers)
        assert sum(t["max_workers"] for t in workers) <= cfg["max_workers"]
    aws_gpu = [t for t in aws["available_node_types"].values() if t["resources"].get("GPU")]
    assert aws_gpu and all(t["node_config"]["InstanceType"][0] in "gp" for t in aws_gpu)
    gcp_gpu = [t for t in gcp["available_node_types"].values() if t["resources"].get("GPU")]
    assert gcp_gpu
    for t in gcp_gpu:  # GCP does not detect resources: what is attached must be what is stated
        accelerators = t["node_config"]["guestAccelerators"]
        assert sum(a["acceleratorCount"] for a in accelerators) == t["resources"]["GPU"]
        assert all(a["acceleratorType"].startswith("nvidia-") for a in accelerators)
        assert t["node_config"]["scheduling"]["onHostMaintenance"] == "TERMINATE"


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_start_commands_share_port_and_token_mode(name: str) -> None:
    cfg = _launcher(name)
    head = _ray_start(cfg["head_start_ray_commands"])
    worker = _ray_start(cfg["worker_start_ray_commands"])
    assert "--head" in head and head["--dashboard-host"] == "0.0.0.0"
    assert head["--autoscaling-config"] == "~/ray_bootstrap_config.yaml"
    assert worker["--address"] == f"$RAY_HEAD_IP:{head['--port']}"
    assert head["env:RAY_AUTH_MODE"] == worker["env:RAY_AUTH_MODE"] == "token"
    assert any(r.endswith(".ray/auth_token") for r in cfg["file_mounts"]), "token not shared"
    assert cfg["head_start_ray_commands"][0] == cfg["worker_start_ray_commands"][0] == "ray stop"


def test_rayjob_is_complete() -> None:
    job, pins = _rayjob(), _pins()
    assert job["apiVersion"] == "ray.io/v1" and job["metadata"]["name"]
    spec = job["spec"]
    assert spec["entrypoint"].strip() and spec["submissionMode"] == "K8sJobMode"
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] >= 0
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == pins["ray"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    groups = [head, *cluster["workerGroupSpecs"]]
    assert all(isinstance(v, str) for g in groups for v in g["rayStartParams"].values())
    containers = [c for g in groups for c in g["template"]["spec"]["containers"]]
    assert all(c["image"] for c in containers) and len({c["image"] for c in containers}) == 1
    gpus = [c["resources"]["limits"].get("nvidia.com/gpu", 0)
            for g in cluster["workerGroupSpecs"] for c in g["template"]["spec"]["containers"]]
    assert gpus and all(int(n) >= 1 for n in gpus)
    # Every pod sees the same shared directory, backed by a claim this file defines.
    claims = {d["metadata"]["name"] for d in _docs(CLUSTER / "kuberay-rayjob.yaml")
              if d.get("kind") == "PersistentVolumeClaim" and "ReadWriteMany" in
              d["spec"]["accessModes"]}
    bases = set()
    for g in groups:
        pod = g["template"]["spec"]
        shared = {v["name"] for v in pod["volumes"]
                  if v.get("persistentVolumeClaim", {}).get("claimName") in claims}
        for c in pod["containers"]:
            base = {e["name"]: e.get("value") for e in c["env"]}["SIMGRAPH_BASE_DIR"]
            bases.add(base)
            assert any(m["name"] in shared and Path(base).is_relative_to(m["mountPath"])
                       for m in c["volumeMounts"]), f"{base} is not on the shared volume"
    assert len(bases) == 1


def test_rayjob_entrypoint_runs_real_simgraph_commands() -> None:
    commands = [argv for _, argv in _segments(_rayjob()["spec"]["entrypoint"])]
    assert any(seg[0] == "simgraph" for seg in commands)
    for seg in commands:  # `cd` to the image's copy of the repo, then simgraph commands
        assert seg[0] == "simgraph" or (seg[0] == "cd" and Path(seg[1]).is_absolute()), seg
        if seg[0] == "simgraph":
            check_simgraph(seg[1:])


def test_every_simgraph_command_shown_or_run_is_real() -> None:
    texts: list[str] = []
    for path in YAMLS:
        texts += [s for d in _docs(path) for s in _strings(d)]
        texts += _shown_commands(path.read_text(), fenced=False)
    for doc in (CLUSTER / "README.md", ROOT / "docs" / "cluster.md", ROOT / "README.md"):
        texts += _shown_commands(doc.read_text(), fenced=True)
    seen = 0
    for text in texts:
        if not re.search(r"(^|\s)(simgraph|ray|kubectl)\s+[a-z]", text):
            continue
        for _, seg in _segments(text):
            if seg[0] == "simgraph":
                check_simgraph(seg[1:])
                seen += 1
            elif seg[0] in ("ray", "kubectl") and any(t.startswith("examples/") for t in seg):
                assert all((ROOT / t).is_file() for t in seg if t.startswith("examples/")), seg
    assert seen >= 10  # YAML usage lines, READMEs, docs/cluster.md, the entrypoint

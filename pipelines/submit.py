"""``simgraph submit [options] -- COMMAND ...``: run a simgraph command on a Ray cluster.

The command is sent through the Ray Jobs API (``JobSubmissionClient``) as the entrypoint
``python -m pipelines.cli COMMAND ...``, with a runtime environment that ships this project as
the job's ``working_dir`` (``.git``, ``.venv``, ``runs/``, ``data/`` and caches excluded), so
every node runs the code of this checkout; the job's logs are streamed back until it ends
(Ctrl-C detaches; the job keeps running).

Before anything is sent, the command is checked here with the same parser and config loaders
the job will use:

* config files must lie inside the project (only the project is shipped); their paths are
  rewritten relative to it, because the job starts in its unpacked copy;
* a relative data / storage / output path would land in that temporary copy and vanish with
  the job: it is refused unless ``--base-dir`` names a directory every node shares (the job
  then gets ``SIMGRAPH_BASE_DIR``; see :mod:`components.io.paths`). Absolute shared paths and
  ``s3://`` / ``gs://`` URIs need nothing.

What is shipped (:func:`package`): the project's files minus :data:`EXCLUDES`, the user's
``excludes``, everything a ``.gitignore`` / ``.rayignore`` ignores, every file or folder whose
name looks like a secret (:data:`SECRET_PATTERNS`: ``.env*``, ``.aws/``, ``*.pem``, ``id_rsa*``,
``.netrc``, service-account JSON, ...) and every symlink that leads out of the project (or to a
folder above itself). Each refused path is listed (not sent); ``--include PATH`` sends one
anyway. The list of what is sent, with sizes, is printed before anything leaves, and Ray gets
an ``excludes`` list that names every refused path, so Ray's own walk packs exactly that list
(it is told not to apply ``.gitignore`` itself: the list already did, and ``--include`` may
override it).

Address: ``--address``, else ``RAY_ADDRESS``, else ``http://127.0.0.1:8265``. Ray 2.60 token
authentication: the token comes from ``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH``,
else ``~/.ray/auth_token``. Ray's client sends it only when ``RAY_AUTH_MODE=token``; when that
variable is unset and a token exists, it is set here (docs/cluster.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fnmatch
import os
import re
import shlex
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from components.config import ConfigError
from components.config.loading import safe_load
from components.errors import SimgraphError
from components.io.paths import BASE_ENV, is_relative, is_uri, project_root
from components.runtime.session import placement_problem

if TYPE_CHECKING:
    from components.config import PretrainConfig

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
# Never shipped: the venv, git history, outputs and datasets (Ray also honours .gitignore).
# gitignore syntax: "/data/" is the top-level dir only; "data/" would also drop components/data.
EXCLUDES = ["/.git", "/.venv", "/runs/", "/data/", "*.beton", "__pycache__/", ".mypy_cache/",
            ".ruff_cache/", ".pytest_cache/", "*.egg-info/"]
# Never shipped unless ``--include`` names them: file or folder names that usually hold secrets
# (matched case-insensitively against every component of a path).
SECRET_PATTERNS = (
    ".env", ".env.*", "*.env", ".envrc", ".aws", ".ssh", ".gnupg", ".azure", ".kube", ".docker",
    "gcloud", ".gcloud", ".vault-token", "credentials", "credentials.*", "*credentials*.json",
    ".credentials*", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.ppk",
    "*.kdbx", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", ".netrc", "_netrc",
    ".git-credentials", ".pgpass", ".pypirc", ".npmrc", ".htpasswd", "*service-account*.json",
    "*service_account*.json", "*serviceaccount*.json", "client_secret*.json",
    "application_default_credentials.json", "secrets", "secrets.*", ".secrets", "*.secret",
    "*.secrets", "*.tfstate", "*.tfstate.*", "auth_token", "*.token", "token.json",
    "kubeconfig", "*.ovpn")
# How many refused paths the listing names one by one (the rest are counted).
SHOW_REFUSED = 20
# Installed by the cluster itself, not per job: Ray must match the cluster's version, and
# ffcv builds against apt packages (examples/cluster/ installs both).
CLUSTER_PROVIDED = ("ray", "ffcv")
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
SUBMITTABLE = ("validate", "preprocess", "pretrain", "run", "evaluate", "sweep")
# ``warn``: a worker group the cluster's nodes cannot hold now is sent anyway, with a warning
# (a cluster whose autoscaler adds the node type later); anything else: refused.
UNPLACED_ENV = "SIMGRAPH_SUBMIT_UNPLACED"
# The State API's own ceiling on one listing (RAY_MAX_LIMIT_FROM_API_SERVER): every node.
NODES_LIMIT = 10_000
NODES_TIMEOUT_S = 10


class SubmitError(SimgraphError, RuntimeError):
    """The command cannot be sent as it is; the message says what to change."""


# ---------------------------------------------------------------------------------------------
# Checking the command.


def parse_job(job: Sequence[str], parser: argparse.ArgumentParser) -> tuple[
        list[str], argparse.Namespace]:
    """The simgraph command after ``--``, parsed with ``parser``: the CLI's own
    (``pipelines.cli.build_parser()``, handed in by the CLI so that only it imports the
    other entry points).

    Raises:
        SubmitError: empty, ``submit`` itself, or arguments the command does not accept.
    """
    argv = list(job[1:] if job and job[0] == "--" else job)
    if not argv:
        raise SubmitError("no command to submit: add `-- COMMAND ...`, e.g. -- pretrain "
                          "pipelines/configs/pretrain/demo.yaml")
    if argv[0] not in SUBMITTABLE:
        raise SubmitError(f"cannot submit {argv[0]!r}: the command must be one of "
                          f"{', '.join(SUBMITTABLE)}")
    parser.exit_on_error = False
    try:
        ns = parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as e:
        raise SubmitError(f"`simgraph {shlex.join(argv)}` is not a valid command ({e}); see "
                          f"`simgraph {argv[0]} --help`") from None
    return argv, ns


def ship_path(path: str, root: Path) -> str:
    """A config file argument as the job will see it: relative to the shipped project.

    Raises:
        SubmitError: the file does not exist or lies outside ``root``.
    """
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise SubmitError(f"{path} does not exist (or is not a file)")
    try:
        return str(p.relative_to(root))
    except ValueError:
        raise SubmitError(
            f"{path} is outside the project dir {root}, the only directory the job ships; "
            "copy it under the project (e.g. pipelines/configs/)") from None


@dataclasses.dataclass(frozen=True)
class WorkerShape:
    """One group of workers the job will ask the cluster for: ``workers`` bundles of ``cpus``
    CPUs and ``gpus`` GPUs under Ray's placement ``strategy``; ``what`` names where they come
    from (``pretrain``, ``run simclr``, ``sweep trials``)."""

    what: str
    workers: int
    cpus: float
    gpus: float
    strategy: str = "PACK"


def _shape(what: str, cfg: PretrainConfig) -> WorkerShape | None:
    """The worker group a pretrain config asks for on a cluster, ``None`` for one that trains
    in the job's own process (``scaling.host: in_process``: nothing is placed). ``auto`` means a
    worker group there, since inside a job Ray sets ``RAY_ADDRESS``
    (``components.runs.recipe.trains_in_process``)."""
    s = cfg.scaling
    if s.host == "in_process":
        return None
    return WorkerShape(what, s.num_workers, s.cpus_per_worker,
                       s.gpus_per_worker if s.use_gpu else 0.0, s.placement_strategy)


def job_configs(ns: argparse.Namespace) -> tuple[list[tuple[str, str]], list[WorkerShape]]:
    """What the command's configs say, read here as the job will read them (and validated on
    the way): (key, value) of every data / storage / output path it will use, and the worker
    groups it will ask the cluster for (:class:`WorkerShape`; a sweep: one trial's).

    Raises:
        SubmitError: a config does not load (the message names the file and key).
    """
    from components.config import PreprocessConfig, PretrainConfig, load_config

    out: list[tuple[str, str]] = []
    shapes: list[WorkerShape | None] = []
    try:
        if ns.command == "preprocess":
            pre = load_config(ns.config, PreprocessConfig, ns.overrides)
            out += [("output", pre.output), ("source.path", pre.source.path or "")]
        elif ns.command == "pretrain":
            cfg = load_config(ns.config, PretrainConfig, ns.overrides)
            out += [("storage", cfg.storage), ("data.dataset", cfg.data.dataset)]
            shapes.append(_shape("pretrain", cfg))
        elif ns.command == "run":
            from components.config import load_pipeline

            pre, runs = load_pipeline(ns.config, ns.overrides)
            out += [("output", pre.output), ("source.path", pre.source.path or "")]
            out += [(f"{name}: storage", cfg.storage) for name, cfg in runs.items()]
            shapes += [_shape(f"run {name}", cfg) for name, cfg in runs.items()]
        elif ns.command == "sweep":
            from components.search_space import load_sweep, trial_config

            sweep = load_sweep(ns.space, ns.overrides)
            ship_path(str(sweep.base_path), project_root())  # the trials load it on the cluster
            base = trial_config(sweep, {}, name="probe", storage=sweep.storage)
            out += [("storage", sweep.storage), ("data.dataset", base.data.dataset)]
            # The sweep's resources are the trials' scaling.*: one trial's workers (its Tune
            # actor holds them itself when it trains in the trial: the same bundle).
            shapes.append(_shape("sweep trials (the sweep's resources.* are their scaling.*)",
                                 base))
        elif ns.command == "evaluate":
            out += [("RUN_DIR", d) for d in ns.run_dirs]
            out += [(k, v) for k, v in (("--out", ns.out), ("--checkpoint", ns.checkpoint)) if v]
    except (ConfigError, OSError) as e:
        raise SubmitError(f"invalid config: {e}") from None
    return [(k, v) for k, v in out if v], [s for s in shapes if s is not None]


@dataclasses.dataclass(frozen=True)
class PreparedJob:
    """The checked command line the job runs, and the worker groups it will ask for."""

    argv: list[str]
    shapes: list[WorkerShape]


def prepare_job(job: Sequence[str], base_dir: str | None, parser: argparse.ArgumentParser,
                root: Path | None = None) -> PreparedJob:
    """The command line the job runs, checked (see the module docstring), with the worker
    groups its configs ask for; ``parser``: the CLI's (:func:`parse_job`).

    Raises:
        SubmitError: bad command or config, a config outside the project, or relative data
            paths without ``base_dir``.
    """
    root = root or project_root()
    argv, ns = parse_job(job, parser)
    if base_dir is not None and (is_uri(base_dir) or not Path(base_dir).is_absolute()):
        raise SubmitError(f"--base-dir {base_dir!r} must be an absolute path that every node "
                          "of the cluster shares (e.g. an NFS / EFS / Filestore mount)")
    # Config files become project-relative: the job starts in its unpacked working_dir.
    file_arg = {"validate": "config", "preprocess": "config", "pretrain": "config",
                "run": "config", "sweep": "space"}.get(ns.command)
    if file_arg is not None:
        given = getattr(ns, file_arg)
        argv[argv.index(given)] = ship_path(given, root)
    paths, shapes = job_configs(ns)
    relative = [(k, v) for k, v in paths if is_relative(v)]
    if relative and base_dir is None:
        listed = ", ".join(f"{k}={v}" for k, v in relative)
        raise SubmitError(
            f"relative paths ({listed}) would be written inside the job's temporary copy of "
            "the project and lost when it ends: pass --base-dir /a/shared/dir (they then mean "
            "that directory), or set them to absolute shared paths or s3:// / gs:// URIs")
    return PreparedJob(argv, shapes)


def prepare_command(job: Sequence[str], base_dir: str | None, parser: argparse.ArgumentParser,
                    root: Path | None = None) -> list[str]:
    """The command line the job runs, checked (:func:`prepare_job`).

    Raises:
        SubmitError: bad command or config, a config outside the project, or relative data
            paths without ``base_dir``.
    """
    return prepare_job(job, base_dir, parser, root).argv


# ---------------------------------------------------------------------------------------------
# The runtime environment.


def project_requirements(root: Path) -> list[str]:
    """The project's Python dependencies from ``pyproject.toml``, minus what the cluster must
    provide itself (:data:`CLUSTER_PROVIDED`)."""
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    name = re.compile(r"^[A-Za-z0-9_.-]+")
    return [d for d in deps if (m := name.match(d)) and m.group(0).lower() not in CLUSTER_PROVIDED]


def runtime_env(root: Path, *, pip: str = "none", base_dir: str | None = None,
                env: Sequence[str] = (), extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job's ``runtime_env``: the project as ``working_dir``, environment variables, and
    (``pip="project"``) the project's pip requirements; ``extra`` (a user YAML) is merged on
    top, its ``env_vars`` and ``excludes`` added to ours.

    Raises:
        SubmitError: a malformed ``--env`` item or ``extra`` that is not a mapping.
    """
    env_vars = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}  # nothing downloads weights
    if base_dir is not None:
        env_vars[BASE_ENV] = base_dir
    for item in env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SubmitError(f"--env {item!r} must be KEY=VALUE")
        env_vars[key] = value
    out: dict[str, Any] = {"working_dir": str(root), "excludes": list(EXCLUDES),
                           "env_vars": env_vars}
    if pip == "project":
        out["pip"] = project_requirements(root)
    elif pip != "none":
        raise SubmitError(f"--pip {pip!r} is not allowed: none or project")
    if extra:
        if not isinstance(extra, dict):
            raise SubmitError("--runtime-env must hold a mapping (runtime_env keys)")
        for key, value in extra.items():
            if key == "env_vars":
                out["env_vars"].update({str(k): str(v) for k, v in value.items()})
            elif key == "excludes":
                out["excludes"] += list(value)
            else:
                out[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# What the job's working_dir holds.


@dataclasses.dataclass
class Package:
    """What :func:`package` found under ``root``: ``files`` (project-relative POSIX path, size)
    that are sent; ``refused`` (path, why) that are not, each named in ``excludes`` for Ray;
    ``included``: refused paths that ``--include`` sends anyway."""

    root: Path
    files: list[tuple[str, int]]
    refused: list[tuple[str, str]]
    included: list[str]
    excludes: list[str]

    @property
    def total(self) -> int:
        return sum(size for _, size in self.files)


def looks_secret(rel: str) -> str | None:
    """The path component of ``rel`` whose name looks like a secret, else ``None``."""
    for part in rel.split("/"):
        low = part.lower()
        if any(fnmatch.fnmatchcase(low, pat) for pat in SECRET_PATTERNS):
            return part
    return None


def _anchored(rel: str) -> str:
    """``rel`` as a gitignore pattern matching exactly that path."""
    return "/" + re.sub(r"([][*?!#\\])", r"\\\1", rel)


def _matcher(base: Path, lines: Sequence[str]) -> Callable[[Path, bool], bool]:
    from ray._private.thirdparty.pathspec import PathSpec  # what Ray's own upload uses

    spec = PathSpec.from_lines("gitwildmatch", lines)

    def match(p: Path, is_dir: bool) -> bool:
        rel = p.relative_to(base).as_posix()
        return bool(spec.match_file(rel) or (is_dir and spec.match_file(rel + "/")))

    return match


def _ignore_file(folder: Path, name: str) -> Callable[[Path, bool], bool] | None:
    f = folder / name
    if not f.is_file():
        return None
    return _matcher(folder, f.read_text(encoding="utf-8", errors="replace").splitlines())


def _included(rel: str, include: Sequence[str]) -> str | None:
    return next((inc for inc in include if rel == inc or rel.startswith(inc + "/")), None)


def package(root: Path, excludes: Sequence[str] = (), include: Sequence[str] = ()) -> Package:
    """Walk ``root`` as Ray's working_dir upload does (``excludes``, then each folder's
    ``.gitignore`` / ``.rayignore``) and decide what is sent (module docstring).

    ``include``: project-relative paths of refused files or folders to send anyway.

    Raises:
        SubmitError: an ``include`` path that names nothing refused.
    """
    root = Path(root).absolute()
    real_root = root.resolve()
    include = [Path(os.path.normpath(i)).as_posix().strip("/") for i in include]
    top = _matcher(root, list(excludes))
    files: list[tuple[str, int]] = []
    refused: list[tuple[str, str]] = []
    used: set[str] = set()
    patterns = list(excludes)

    def refuse(rel: str, why: str) -> bool:
        inc = _included(rel, include)
        if inc is not None:
            used.add(inc)
            return False
        refused.append((rel, why))
        patterns.append(_anchored(rel))
        return True

    def walk(folder: Path, ignores: list[Callable[[Path, bool], bool]]) -> None:
        own = [m for m in (_ignore_file(folder, ".gitignore"), _ignore_file(folder, ".rayignore"))
               if m is not None]
        ignores = ignores + own
        for entry in sorted(folder.iterdir(), key=lambda p: p.name):
            rel = entry.relative_to(root).as_posix()
            is_dir = entry.is_dir()
            if top(entry, is_dir):
                continue
            secret = looks_secret(rel)
            if secret is not None and refuse(rel, f"{secret!r} looks like a secret"):
                continue
            if entry.is_symlink():
                target = entry.resolve()
                outside = target != real_root and real_root not in target.parents
                above = is_dir and target in entry.absolute().parents
                if (outside or above or looks_secret(target.as_posix())) and refuse(
                        rel, f"a symlink to {target}" + (
                            ", outside the project" if outside else
                            ", a folder above it" if above else ", which looks like a secret")):
                    continue
            if any(m(entry, is_dir) for m in ignores) and refuse(rel, "ignored by .gitignore"):
                continue
            if is_dir:
                walk(entry, ignores)
            elif entry.is_file():
                files.append((rel, entry.stat().st_size))

    walk(root, [])
    unused = [i for i in include if i not in used]
    if unused:
        raise SubmitError(f"--include {unused[0]}: nothing refused has that path (relative to "
                          f"{root}); refused: {', '.join(r for r, _ in refused) or 'nothing'}")
    return Package(root, files, refused, sorted(used), patterns)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def describe_package(pkg: Package) -> list[str]:
    """The listing printed before a job is sent: every top-level file, and each top-level
    folder with its file count, each with its size; then what was refused and why."""
    groups: dict[str, list[int]] = {}
    for rel, size in pkg.files:
        head, sep, _ = rel.partition("/")
        g = groups.setdefault(head + ("/" if sep else ""), [0, 0])
        g[0] += 1
        g[1] += size
    lines = [f"sending {len(pkg.files)} files, {_size(pkg.total)}, from {pkg.root}:"]
    width = max((len(k) for k in groups), default=0)
    for name, (count, size) in sorted(groups.items()):
        what = (f"{count} file{'s' if count != 1 else ''}" if name.endswith("/") else "")
        lines.append(f"  {name:<{width}}  {_size(size):>10}  {what}".rstrip())
    for rel in pkg.included:
        lines.append(f"  sent on request (--include): {rel}")
    if pkg.refused:
        lines.append(f"not sent ({len(pkg.refused)}; `--include PATH` sends one):")
        lines += [f"  {rel}: {why}" for rel, why in pkg.refused[:SHOW_REFUSED]]
        if len(pkg.refused) > SHOW_REFUSED:
            lines.append(f"  ... and {len(pkg.refused) - SHOW_REFUSED} more")
    return lines


def checked_env(env: dict[str, Any], include: Sequence[str] = ()) -> tuple[dict[str, Any],
                                                                          Package]:
    """``env`` with its ``excludes`` extended by every path :func:`package` refuses, and that
    package.

    Raises:
        SubmitError: ``py_modules`` from a local folder (not checked for secrets), or a bad
            ``include``.
    """
    local = [m for m in env.get("py_modules") or [] if not is_uri(str(m)) and "://" not in
             str(m)]
    if local:
        raise SubmitError(f"runtime_env py_modules {local[0]!r} is a local folder, which submit "
                          "does not check for secrets: put the code under the project, or "
                          "upload it yourself and name its URI")
    pkg = package(Path(env["working_dir"]), env.get("excludes", ()), include)
    return {**env, "excludes": pkg.excludes}, pkg


@contextlib.contextmanager
def _ray_skips_gitignore() -> Iterator[None]:
    """Ray's upload must not apply ``.gitignore`` on its own: :func:`package` did, and
    ``--include`` may send an ignored file (``excludes`` names each ignored path instead)."""
    key = "RAY_RUNTIME_ENV_IGNORE_GITIGNORE"
    old = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def entrypoint(argv: Sequence[str]) -> str:
    """``python -m pipelines.cli ...``: the shipped copy, not an installed ``simgraph``."""
    return "python -m pipelines.cli " + shlex.join(argv)


# ---------------------------------------------------------------------------------------------
# Sending and following the job.


def resolve_address(address: str | None) -> str:
    return address or os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS


async def _stream(client: Any, job_id: str) -> None:
    async for lines in client.tail_job_logs(job_id):
        print(lines, end="", flush=True)


def follow(client: Any, job_id: str, poll_s: float = 1.0) -> str:
    """Stream the job's logs to stdout until it ends; its final status."""
    asyncio.run(_stream(client, job_id))
    while (status := str(client.get_job_status(job_id).value)) not in TERMINAL:
        time.sleep(poll_s)  # the log stream can close just before the status is final
    return status


def use_token_if_present() -> bool:
    """Turn on Ray's token mode for this client when ``RAY_AUTH_MODE`` is unset and a token is
    available (Ray's client otherwise sends none and a token-auth cluster refuses it)."""
    if os.environ.get("RAY_AUTH_MODE"):
        return os.environ["RAY_AUTH_MODE"].lower() == "token"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    if not os.environ.get("RAY_AUTH_TOKEN") and not Path(path).is_file():
        return False
    os.environ["RAY_AUTH_MODE"] = "token"  # read when Ray's config is first loaded (import)
    return True


def cluster_nodes(address: str) -> list[dict[str, float]]:
    """The total resources (Ray's names: ``CPU``, ``GPU``, ...) of each alive node of the
    cluster whose dashboard is at ``address``, from its State API (``GET /api/v0/nodes``, what
    ``ray list nodes`` reads). Ray resolves ``address`` as ``JobSubmissionClient`` does
    (``RAY_API_SERVER_ADDRESS`` / ``RAY_ADDRESS`` win) and sends the same token, so this asks
    the dashboard the job goes to.

    Raises:
        Exception: the query failed: a dashboard without the State API (Ray < 2.0, or a
            404), a timeout, an incomplete listing (``raise_on_missing_output``: a partial
            answer could refuse a job that fits), or an answer of another schema.
    """
    from ray.util.state import list_nodes

    nodes = list_nodes(address=address, limit=NODES_LIMIT, timeout=NODES_TIMEOUT_S,
                       raise_on_missing_output=True)
    return [{str(k): float(v) for k, v in (n.resources_total or {}).items()}
            for n in nodes if n.state == "ALIVE"]


def check_shapes(shapes: Sequence[WorkerShape], address: str) -> None:
    """Before the job leaves: can the cluster's alive nodes hold each worker group the command
    asks for (:func:`components.runtime.session.placement_problem`, the check a run's start makes)?
    A group they cannot hold is refused with the numbers and the fix: Ray would wait for
    resources that never come, and Ray Train fails only after its start timeout, without
    saying why. With ``SIMGRAPH_SUBMIT_UNPLACED=warn`` (a cluster whose autoscaler adds a
    larger node type, e.g. GPU workers scaled to zero) it is a warning and the job goes.
    A cluster that cannot be asked: one warning line, and the job goes (its start checks).

    Raises:
        SubmitError: a worker group the alive nodes cannot hold.
    """
    if not shapes:
        return
    try:
        nodes = cluster_nodes(address)
    except Exception as e:  # noqa: BLE001 - HTTP, schema and State API errors of several kinds
        why = (str(e).strip().splitlines() or [""])[0][:200]
        print(f"simgraph submit: warning: cannot list the nodes of the cluster at {address} "
              f"({type(e).__name__}: {why}); the workers' shape is checked when the run starts",
              file=sys.stderr)
        return
    warn = os.environ.get(UNPLACED_ENV, "").strip().lower() == "warn"
    for shape in shapes:
        problem = placement_problem(shape.workers, shape.cpus, shape.gpus, nodes,
                                    f"the cluster at {address}", shape.strategy)
        if problem is None:
            continue
        if warn:
            print(f"simgraph submit: warning: {shape.what}: {problem} Sent anyway "
                  f"({UNPLACED_ENV}=warn): it waits for a node that holds a worker",
                  file=sys.stderr)
            continue
        raise SubmitError(f"{shape.what}: {problem} Nothing was sent (if the cluster's "
                          f"autoscaler adds a node type that holds one, set {UNPLACED_ENV}=warn)")


def submit(argv: Sequence[str], env: dict[str, Any], address: str, job_id: str | None = None,
           wait: bool = True, shapes: Sequence[WorkerShape] = ()) -> int:
    """Send the job (after :func:`check_shapes`) and, with ``wait``, follow it to its end;
    the exit status: 0 when it succeeded (or was sent, without ``wait``).

    Raises:
        SubmitError: the cluster cannot be reached, cannot hold a worker group of ``shapes``,
            or refused the job.
    """
    from components.io.storage import has_credentials, redact

    use_token_if_present()
    from ray.job_submission import JobSubmissionClient

    try:
        client = JobSubmissionClient(address)
    except Exception as e:  # noqa: BLE001 - connection / auth errors of several kinds
        raise SubmitError(f"cannot reach the Ray cluster at {address}: {e}") from None
    check_shapes(shapes, address)
    job_id = job_id or f"simgraph-{argv[0]}-{time.strftime('%Y%m%d-%H%M%S')}"
    if has_credentials(list(argv)):
        # The job needs them, so its entrypoint carries them; the metadata (what `ray job list`
        # and the dashboard show first) does not.
        print("simgraph submit: warning: the command holds URI credentials (user:secret@); the "
              "cluster keeps the job's entrypoint, which anyone who can list its jobs reads: "
              "prefer the nodes' instance role or credentials in their environment",
              file=sys.stderr)
    try:
        with _ray_skips_gitignore():
            job_id = client.submit_job(entrypoint=entrypoint(argv), runtime_env=env,
                                       submission_id=job_id,
                                       metadata={"simgraph": redact(shlex.join(argv))})
    except Exception as e:  # noqa: BLE001 - HTTP / packaging errors of several kinds
        raise SubmitError(f"the cluster at {address} refused job {job_id}: "
                          f"{redact(str(e))}") from None
    print(f"simgraph submit: job {job_id} sent to {address}", flush=True)
    if not wait:
        print(f"follow it: ray job logs --address {address} -f {job_id}")
        return 0
    try:
        status = follow(client, job_id)
    except KeyboardInterrupt:
        print(f"\nsimgraph submit: detached; job {job_id} keeps running (ray job logs "
              f"--address {address} -f {job_id}; ray job stop --address {address} {job_id})",
              file=sys.stderr)
        return 130
    print(f"simgraph submit: job {job_id} {status}", flush=True)
    return 0 if status == "SUCCEEDED" else 1


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``simgraph submit``; ``parser``: the CLI's, to check the job's command with."""
    root = project_root()
    try:
        job = (prepare_job(args.job, args.base_dir, parser, root) if not args.skip_check
               else PreparedJob(parse_job(args.job, parser)[0], []))
        extra = None
        if args.runtime_env:
            extra = safe_load(Path(args.runtime_env).read_text(), args.runtime_env)
        env = runtime_env(root, pip=args.pip, base_dir=args.base_dir, env=args.env,
                          extra=extra)
        env, pkg = checked_env(env, getattr(args, "include", None) or ())
        for line in describe_package(pkg):
            print(f"simgraph submit: {line}" if not line.startswith(" ") else line)
        return submit(job.argv, env, resolve_address(args.address), args.job_id,
                      wait=not args.no_wait, shapes=job.shapes)
    except (SubmitError, OSError, yaml.YAMLError) as e:
        print(f"simgraph submit: {e}", file=sys.stderr)
        return 2


__all__ = ["Package", "PreparedJob", "SubmitError", "WorkerShape", "check_shapes",
           "checked_env", "cluster_nodes", "describe_package", "entrypoint", "job_configs",
           "looks_secret", "main", "package", "parse_job", "prepare_command", "prepare_job",
           "project_requirements", "runtime_env", "submit"]

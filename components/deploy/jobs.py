"""The job a ``simgraph submit`` sends: its command checked here, before anything leaves,
with the same parser and config loaders the job will use, and the worker groups it will ask
the cluster for (:class:`WorkerShape`); the error every step of a submission raises
(:class:`SubmitError`).

* config files must lie inside the project (only the project is shipped); their paths are
  rewritten relative to it, because the job starts in its unpacked copy;
* a relative data / storage / output path would land in that temporary copy and vanish with
  the job: it is refused unless ``--base-dir`` names a directory every node shares (the job
  then gets ``SIMGRAPH_BASE_DIR``; see :mod:`components.io.paths`). Absolute shared paths and
  ``s3://`` / ``gs://`` URIs need nothing.

The parser is the CLI's (``pipelines.cli.build_parser()``), handed in by the command: a
component never imports a pipeline.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from collections.abc import Sequence
from pathlib import Path

from components.config import (
    ConfigError,
    PreprocessConfig,
    PretrainConfig,
    load_config,
    load_pipeline,
)
from components.errors import SimgraphError
from components.io.paths import is_relative, is_uri, project_root
from components.search_space import load_sweep, trial_config

SUBMITTABLE = ("validate", "preprocess", "pretrain", "run", "evaluate", "sweep")


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


@dataclasses.dataclass(frozen=True, kw_only=True)
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
    return WorkerShape(what=what, workers=s.num_workers, cpus=s.cpus_per_worker,
                       gpus=s.gpus_per_worker if s.use_gpu else 0.0,
                       strategy=s.placement_strategy)


def job_configs(ns: argparse.Namespace) -> tuple[list[tuple[str, str]], list[WorkerShape]]:
    """What the command's configs say, read here as the job will read them (and validated on
    the way): (key, value) of every data / storage / output path it will use, and the worker
    groups it will ask the cluster for (:class:`WorkerShape`; a sweep: one trial's).

    Raises:
        SubmitError: a config does not load (the message names the file and key).
    """
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
            pre, runs = load_pipeline(ns.config, ns.overrides)
            out += [("output", pre.output), ("source.path", pre.source.path or "")]
            out += [(f"{name}: storage", cfg.storage) for name, cfg in runs.items()]
            shapes += [_shape(f"run {name}", cfg) for name, cfg in runs.items()]
        elif ns.command == "sweep":
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


__all__ = ["PreparedJob", "SUBMITTABLE", "SubmitError", "WorkerShape", "job_configs",
           "parse_job", "prepare_command", "prepare_job", "ship_path"]

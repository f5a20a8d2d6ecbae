"""``simgraph submit [options] -- COMMAND ...``: run a simgraph command on a Ray cluster.

The command is sent through the Ray Jobs API (``JobSubmissionClient``) as the entrypoint
``python -m pipelines.cli COMMAND ...``, with a runtime environment that ships this project as
the job's ``working_dir`` (``.git``, ``.venv``, ``runs/``, ``data/`` and caches excluded), so
every node runs the code of this checkout; the job's logs are streamed back until it ends
(Ctrl-C detaches; the job keeps running).

The engine is :mod:`components.deploy`: the command checked before anything is sent, with the
CLI's parser handed in (``jobs.py``), what is shipped and what is refused (``package.py``), the
cluster's shape check, the submission and its logs (``cluster.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from components.config.loading import safe_load
from components.deploy.cluster import resolve_address, submit
from components.deploy.jobs import PreparedJob, SubmitError, parse_job, prepare_job
from components.deploy.package import checked_env, describe_package, runtime_env
from components.io.paths import project_root


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


__all__ = ["main"]

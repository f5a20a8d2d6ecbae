"""Sending a job to a Ray cluster and following it: the cluster's address and token, the
check that its alive nodes can hold each worker group the job asks for (:func:`check_shapes`),
the Jobs API submission (``JobSubmissionClient``) of the entrypoint ``python -m pipelines.cli
COMMAND ...``, and the job's logs streamed back until it ends (Ctrl-C detaches; the job keeps
running).

Address: ``--address``, else ``RAY_ADDRESS``, else ``http://127.0.0.1:8265``. Ray 2.60 token
authentication: the token comes from ``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH``,
else ``~/.ray/auth_token``. Ray's client sends it only when ``RAY_AUTH_MODE=token``; when that
variable is unset and a token exists, it is set here (docs/cluster.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from components.deploy.jobs import SubmitError, WorkerShape
from components.runtime.session import placement_problem

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# ``warn``: a worker group the cluster's nodes cannot hold now is sent anyway, with a warning
# (a cluster whose autoscaler adds the node type later); anything else: refused.
UNPLACED_ENV = "SIMGRAPH_SUBMIT_UNPLACED"
# The State API's own ceiling on one listing (RAY_MAX_LIMIT_FROM_API_SERVER): every node.
NODES_LIMIT = 10_000
NODES_TIMEOUT_S = 10


@contextlib.contextmanager
def _ray_skips_gitignore() -> Iterator[None]:
    """Ray's upload must not apply ``.gitignore`` on its own:
    :func:`components.deploy.package.package` did, and ``--include`` may send an ignored file
    (``excludes`` names each ignored path instead)."""
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
    from ray.util.state import list_nodes  # Ray: imported only when a cluster is asked

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
    from components.io.storage import has_credentials, redact  # pyarrow: only when sending

    use_token_if_present()
    # Ray reads RAY_AUTH_MODE when first imported: after use_token_if_present set it.
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


__all__ = ["DEFAULT_ADDRESS", "UNPLACED_ENV", "check_shapes", "cluster_nodes", "entrypoint",
           "follow", "resolve_address", "submit", "use_token_if_present"]

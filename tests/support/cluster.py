"""A real multi-node Ray cluster on one machine, kept on loopback in its own network namespace.

:class:`LoopbackCluster` creates the namespace ``simgraph-<pid>-<n>`` (only ``lo``), starts a
head (``ray start --head``, dashboard on 127.0.0.1) and worker raylets in it with Ray 2.60's
token authentication (a fresh token file, ``RAY_AUTH_MODE=token``), runs commands in it, and
on :meth:`close` removes everything it started — SIGTERM, then SIGKILL, of every process in
the namespace (not ``ray stop --force``, which stops every Ray on the machine: the rest of the
suite runs beside this cluster), then the namespace — whatever happened before, and checks
that nothing is left.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.procs import kill_until_gone

BIN = Path(sys.executable).parent  # the venv's ray / simgraph scripts
PORT = 6390
DASHBOARD = "http://127.0.0.1:8265"
_count = itertools.count()


def can_make_namespaces() -> str | None:
    """Why this machine cannot run the cluster tests, or None."""
    if os.geteuid() != 0:
        return "creating a network namespace needs root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    return None


class LoopbackCluster:
    def __init__(self, cpus_per_node: float = 1, object_store_mb: int = 200) -> None:
        self.ns = f"simgraph-{os.getpid()}-{next(_count)}"
        # Short: Ray's Unix socket paths live under it (107-byte limit).
        self.tmp = Path(tempfile.mkdtemp(prefix="sgc-"))
        # A folder only the head (and this process) sees: every added node has its own empty
        # tmpfs there (a mount namespace of its own), as a separate machine has its own disk.
        self.private = self.tmp / "private"
        self.private.mkdir()
        self.token = self.tmp / "token"
        self.token.write_text(secrets.token_hex(32))
        self.cpus, self.store = cpus_per_node, object_store_mb * 1_000_000
        self.env = {**os.environ, "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN_PATH": str(self.token),
                    "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
                    "RAY_USAGE_STATS_ENABLED": "0",
                    # Train's controller polls every 2 s by default and a report waits for
                    # it: what a local Ray gets (components/runtime/session.py), for the
                    # tests' one-second epochs
                    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
                    # The GCS marks a node dead after `failure_threshold` failed health checks
                    # `period_ms` apart: Ray's 5 × 3 s made the killed-raylet test wait ~14 s
                    # to see the node go; ~2 s here (a check still waits Ray's 10 s for a
                    # busy raylet's answer before it counts as failed)
                    "RAY_health_check_period_ms": "500",
                    "RAY_health_check_failure_threshold": "4"}
        self.env.pop("RAY_ADDRESS", None)
        self.started = False
        self.nodes_added = 0

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, workers: int = 1) -> LoopbackCluster:
        subprocess.run(["ip", "netns", "add", self.ns], check=True)
        self.started = True
        subprocess.run(["ip", "netns", "exec", self.ns, "ip", "link", "set", "lo", "up"],
                       check=True)
        self.ray("start", "--head", f"--port={PORT}", "--node-ip-address=127.0.0.1",
                 "--dashboard-host=127.0.0.1", f"--temp-dir={self.tmp / 'ray'}",
                 f"--num-cpus={self.cpus}", f"--object-store-memory={self.store}")
        for _ in range(workers):
            self.add_node()
        return self

    def add_node(self) -> None:
        """Another raylet with a temp dir of its own, as a separate machine would have: nodes
        sharing one would share (and garbage-collect) each other's unpacked working dirs."""
        before = {n["node_id"] for n in self.nodes()}
        self.nodes_added += 1
        # `ray start` leaves the raylet (and the workers it forks) in unshare's namespace
        self.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                  'mount -t tmpfs tmpfs "$0" && exec "$@"', str(self.private),
                  str(BIN / "ray"), "start", f"--address=127.0.0.1:{PORT}",
                  "--node-ip-address=127.0.0.1",
                  f"--temp-dir={self.tmp / f'ray-node{self.nodes_added}'}",
                  f"--num-cpus={self.cpus}", f"--object-store-memory={self.store}"],
                 timeout=180)
        self.wait(lambda: len({n["node_id"] for n in self.nodes()} - before) == 1, 60,
                  "the new node to register")

    def close(self) -> None:
        """Remove the cluster and the namespace; raise if anything survives."""
        if not self.started:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        try:
            for pid in self.pids():  # a chance to exit cleanly: raylets reap their workers
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            self.wait(lambda: not self.pids(), 3, "the cluster's processes to exit")
        except TimeoutError:
            pass
        finally:
            kill_until_gone(self.pids, rounds=50, pause=0.2)
            subprocess.run(["ip", "netns", "del", self.ns], check=False)
            shutil.rmtree(self.tmp, ignore_errors=True)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        if self.ns in left.split() or any(line.split()[0] == self.ns
                                          for line in left.splitlines() if line.strip()):
            raise RuntimeError(f"network namespace {self.ns} survived cleanup")

    def __enter__(self) -> LoopbackCluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- running things in the namespace ---------------------------------------------------
    def cmd(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]

    def run(self, argv: list[str], timeout: float = 600, check: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(self.cmd(argv), env=env or self.env, capture_output=True,
                           text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}):\n{p.stdout[-3000:]}"
                               f"\n{p.stderr[-3000:]}")
        return p

    def popen(self, argv: list[str], log: Path, env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
        with open(log, "wb") as f:
            return subprocess.Popen(self.cmd(argv), env=env or self.env, stdout=f,
                                    stderr=subprocess.STDOUT)

    def ray(self, *args: str) -> str:
        return self.run([str(BIN / "ray"), *args], timeout=180).stdout

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True,
                             text=True).stdout
        return [int(p) for p in out.split()]

    def nodes(self) -> list[dict[str, Any]]:
        """Alive nodes, from the State API."""
        out = self.ray("list", "nodes", f"--address=127.0.0.1:{PORT}", "--format=json",
                       "--filter", "state=ALIVE")
        return list(json.loads(out[out.index("["):]))

    def raylets(self) -> dict[str, int]:
        """Raylet pid by the name of its node's temp dir: ``ray`` is the head's,
        ``ray-node<k>`` the k-th node added."""
        found = {}
        root = str(self.tmp)
        for pid in self.pids():
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            if args and args[0].endswith("/raylet"):
                for a in args:
                    if a.startswith("--raylet_socket_name=") and root in a:
                        found[a.split(root, 1)[1].strip("/").split("/")[0]] = pid
        return found

    def listening(self) -> list[str]:
        """Local addresses of every listening TCP socket in the namespace."""
        out = self.run(["ss", "-ltnH"]).stdout
        return [line.split()[3] for line in out.splitlines() if line.strip()]

    @staticmethod
    def wait(cond: Any, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if cond():
                    return
            except (OSError, ValueError, RuntimeError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")

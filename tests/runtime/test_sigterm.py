"""SIGTERM (``kill``, a service stop, a scheduler's preemption) ends a command like Ctrl-C: one
line and exit 143, what was complete kept — not the Ray core worker's native handler's stack
dump and abort (exit 134), which a ``simgraph preprocess`` with a local Ray gave."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from components.errors import TERMINATED, Terminated, run_command

ROOT = Path(__file__).resolve().parents[2]

BODY = """
import sys, time
from components.errors import run_command
from components.runtime.session import ray_session

def body():
    with ray_session(1):
        print("ready", flush=True)
        time.sleep(120)

sys.exit(run_command("preprocess", body))
"""


def test_sigterm_inside_a_ray_session_is_one_line_and_exit_143(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = tmp_path / "log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-c", BODY], cwd=ROOT, env=env, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 120
        while "ready" not in log.read_text():
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert rc == TERMINATED, text[-3000:]
    assert text.count("simgraph preprocess: terminated (SIGTERM)") == 1
    assert "SIGTERM received" not in text and "Traceback" not in text


def test_run_command_turns_terminated_into_its_exit_code() -> None:
    def body() -> None:
        raise Terminated()

    assert run_command("pretrain", body) == TERMINATED
    # the handler is the command's now: SIGTERM raises in the main thread
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
        raise AssertionError("SIGTERM did not raise")
    except Terminated:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

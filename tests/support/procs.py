"""Process helpers for tests that SIGKILL a whole pipeline (driver + Ray) by session id."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path


def session_pids(sid: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":  # state; session id (field 6)
                pids.append(int(d.name))
    return pids


def kill_until_gone(pids: Callable[[], list[int]], rounds: int = 100,
                    pause: float = 0.1) -> None:
    """SIGKILL every process ``pids()`` lists, again and again until it lists none (Ray keeps
    spawning) or ``rounds`` run out."""
    for _ in range(rounds):
        alive = pids()
        if not alive:
            return
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(pause)


def kill_session(sid: int) -> None:
    """SIGKILL every live process of the session until none is left."""
    kill_until_gone(lambda: session_pids(sid))

"""Process helpers for tests that SIGKILL a whole pipeline (driver + Ray) by session id."""

from __future__ import annotations

import os
import signal
import time
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


def kill_session(sid: int) -> None:
    """SIGKILL every live process of the session until none is left (Ray keeps spawning)."""
    for _ in range(100):
        pids = session_pids(sid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)

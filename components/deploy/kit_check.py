"""Proving an offline install kit on this machine: a clean venv, no network, simgraph run
from the kit alone.

``--check`` then proves the kit on this machine (:func:`check_install`, ``make
offline-install-check``): a venv of ``--python`` with no packages at all, ``install.sh`` run
in a network namespace with only loopback (a connection to the index fails there, checked
first), and simgraph run from the kit there: imports, ``simgraph validate``, ``simgraph
preprocess`` (Ray Data) of a tiny Fashion-MNIST subset, a 1-epoch in-process ``simgraph
pretrain`` on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from components.deploy.wheels import ROOT, KitError

FASHION_SUBSET = 30  # images per class of the check's dataset (10 classes; 10 % of it is val)


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def offline(cmd: Sequence[str]) -> list[str]:
    """``cmd`` in a new network namespace with only loopback (up: a local Ray needs it): any
    download attempt fails, as on a node without network."""
    return ["unshare", "-n", "bash", "-c", 'ip link set lo up && exec "$@"', "offline", *cmd]


def check_install(kit: Path, python: str, work: Path | None = None,
                  say: Callable[[str], object] = print) -> bool:
    """Install ``kit`` into a clean venv of ``python`` with no network, and run simgraph from
    it (the module docstring's ``--check``). Each step prints one line (``PASS`` / ``FAIL``,
    seconds, what it ran); the first failure stops the check with its output's tail. The
    checkout is not on any path: the commands run in ``work`` with only the kit's site on
    ``PYTHONPATH``, and read the project's configs by absolute path.

    Returns:
        Whether every step passed.

    Raises:
        KitError: ``kit`` is no kit, or ``unshare -n`` cannot run here (needs root or
            CAP_SYS_ADMIN).
    """
    kit = kit.resolve()  # the steps run in ``work``
    if not (kit / "kit.json").is_file():
        raise KitError(f"--check: {kit} holds no kit.json: build the kit first (drop "
                       "--no-build)")
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode:
        raise KitError("--check needs `unshare -n` (a network namespace) to prove that the "
                       "install downloads nothing: run it as root or with CAP_SYS_ADMIN")
    meta = json.loads((kit / "kit.json").read_text())
    pieces = [kit / p for p in meta["pieces"]]
    say(f"check: kit {kit}: {len(meta['packages'])} packages for Python {meta['python']}, "
        f"{len(pieces)} piece(s), {sum(p.stat().st_size for p in pieces) / 2**20:.1f} MiB")
    with contextlib.ExitStack() as stack:
        if work is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(
                prefix="simgraph-kit-check-")))
        work.mkdir(parents=True, exist_ok=True)
        venv, site = work / "venv", work / "site"
        py = venv / "bin/python"
        # Nothing of this machine's environment but the system's PATH: no venv, no
        # PYTHONPATH but the kit's (what env.sh sets), no network (offline()).
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
               "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1", "SIMGRAPH_RAY_DASHBOARD": "0",
               "PYTHONPATH": str(site)}
        configs = ROOT / "pipelines/configs"
        data, runs = work / "data", work / "runs"
        imports = ("import sys, torch, torchvision, ray, ray.train, ray.tune, ffcv, optuna, "
                   "cv2, components, pipelines.cli; "
                   f"assert components.__file__.startswith({str(site)!r}), components.__file__; "
                   "print('torch', torch.__version__, 'ray', ray.__version__, 'ffcv', "
                   "ffcv.__version__, 'optuna', optuna.__version__, 'from', "
                   "components.__file__)")
        simgraph = [str(site / "bin/simgraph")]
        # No network in the namespace: a connection to the index must fail (exit 0 then).
        no_net = ("import socket\ntry:\n    socket.create_connection(('pypi.org', 443), "
                  "timeout=10)\nexcept OSError as e:\n    print('pypi.org unreachable:', e)\n"
                  "else:\n    raise SystemExit('pypi.org is reachable: not an offline check')")
        # (name, command, extra environment, the line of its output to show: a regex)
        steps: list[tuple[str, list[str], dict[str, str], str]] = [
            ("venv", [python, "-m", "venv", "--without-pip", str(venv)], {}, "$^"),
            ("network", offline([str(py), "-c", no_net]), {}, "unreachable"),
            ("install", offline(["bash", str(kit / "install.sh"), str(site)]),
             {"PYTHON": str(py)}, "import"),
            ("imports", offline([str(py), "-c", imports]), {}, "torch"),
            ("validate", offline([*simgraph, "validate", str(configs / "pretrain/demo.yaml")]),
             {}, "^name:"),
            ("preprocess", offline([*simgraph, "preprocess", str(configs / "data/demo.yaml"),
                                    f"output={data}", f"source.max_per_class={FASHION_SUBSET}",
                                    "captions.enabled=false"]), {}, r"^train\s"),
            ("pretrain", offline([*simgraph, "pretrain", str(configs / "pretrain/demo.yaml"),
                                  "name=offline", f"storage={runs}", f"data.dataset={data}",
                                  "train.epochs=1", "scaling.num_workers=1",
                                  "scaling.host=in_process"]), {}, r"epoch 1/1"),
        ]
        start = time.monotonic()
        for name, cmd, extra, show in steps:
            t = time.monotonic()
            r = subprocess.run(cmd, cwd=work, env={**env, **extra}, capture_output=True,
                               text=True, timeout=1800)
            took = time.monotonic() - t
            last = next((ln.strip() for ln in reversed(r.stdout.splitlines())
                         if re.search(show, ln)), "")[:160]
            if r.returncode:
                tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-25:])
                say(f"check: {name:<10} FAIL {took:6.1f} s (exit {r.returncode})\n{tail}")
                return False
            say(f"check: {name:<10} PASS {took:6.1f} s  {last}")
        say(f"check: every step passed in {time.monotonic() - start:.0f} s; the kit's site is "
            f"{_du(site) / 2**20:.0f} MiB unpacked, the clean venv "
            f"{_du(venv) / 2**20:.1f} MiB")
    return True


__all__ = ["FASHION_SUBSET", "check_install", "offline"]

"""``model.init`` on the driver, before anything runs (:func:`check_run_init`): the file's
keys mapped onto the configured encoder (built on the meta device: shapes only) at a fresh
start, its sha256 recorded in the run dir (:data:`RUN_INIT`, ``init.json``), and a resume
checked against that record.

A resume loads its checkpoint and never reads the init file for weights. But the file is
where the run's weights came from (the model card names it, ``evaluate``'s baseline row is
scored on it), so a resume that finds **another file** under the same path (another sha256)
is refused: restore the file, or start a new run. A resume that finds no file at the path
goes on with a warning in the summary (the checkpoint holds everything training needs;
``evaluate`` then skips the baseline).
"""

from __future__ import annotations

import json
from typing import Any

from components.config import PretrainConfig
from components.runs.errors import RunError

RUN_INIT = "init.json"  # {"path", "sha256"} of model.init, written on a run's first start


def check_run_init(cfg: PretrainConfig, resuming: bool) -> dict[str, Any]:
    """What :attr:`RunFacts.init` holds for ``cfg``: ``{}`` without ``model.init``; else
    ``path``, ``sha256`` and ``summary`` (the run summary's line) — at a fresh start after the
    key check, on a resume from the file alone (``summary`` says it is not read).

    Raises:
        InitWeightsError: a fresh start whose file is missing, unreadable or does not fit.
    """
    from pathlib import Path

    from components.io.files import sha256_file
    from components.models.init_weights import check_init, check_init_path

    path = cfg.model.init
    if not path:
        return {}
    if resuming:
        if not Path(path).is_file():
            return {"path": path, "sha256": None,
                    "summary": f"{path}: not found (the run resumes from its checkpoint, "
                               "which holds the weights)"}
        return {"path": path, "sha256": sha256_file(path),
                "summary": f"{path}: not read (the run resumes from its checkpoint)"}
    check_init_path(path)
    plan = check_init(path, cfg.model, cfg.data.augment.resolution)
    return {"path": path, "sha256": sha256_file(path), "summary": plan.summary(), "load": True}


def init_payload(facts_init: dict[str, Any]) -> bytes | None:
    """The bytes of the ``model.init`` file the workers load (:attr:`RunFacts.init` with
    ``load``: a fresh start), read here, on the node that checked it; None when the run loads
    nothing from it (no ``model.init``, or a resume).

    Raises:
        RunError: the file changed (or went) since the driver checked it.
    """
    import hashlib
    from pathlib import Path

    if not facts_init.get("load"):
        return None
    path = facts_init["path"]
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise RunError(f"model.init {path} cannot be read any more ({e.strerror}); start the "
                       "run again") from None
    if hashlib.sha256(data).hexdigest() != facts_init["sha256"]:
        raise RunError(f"model.init {path} changed since the run was prepared (sha256 "
                       f"{facts_init['sha256'][:12]}… then); start the run again")
    return data


def record_run_init(run_dir: str, name: str, init: dict[str, Any]) -> None:
    """Write ``init.json`` on a run's first start; on a resume, refuse another file under the
    recorded path (module docstring).

    Raises:
        RunError: the file's sha256 differs from the one the run started from.
    """
    from components.io import storage

    if not init:
        return
    path = storage.join(run_dir, RUN_INIT)
    if storage.exists(path):
        was = json.loads(storage.read_text(path))
        now = init.get("sha256")
        if now is not None and was.get("sha256") != now:
            raise RunError(
                f"run {name!r} started from model.init {init['path']} with sha256 "
                f"{str(was.get('sha256'))[:12]}…, but that path now holds another file "
                f"(sha256 {now[:12]}…); restore the original file, or start a new run "
                "(a new name=)")
        return
    if init.get("sha256") is not None:
        storage.write_text(path, json.dumps({"path": init["path"], "sha256": init["sha256"]},
                                            sort_keys=True))


def read_run_init(run_dir: str) -> dict[str, Any] | None:
    """The run dir's ``init.json`` (``path``, ``sha256``), or None."""
    from components.io import storage

    path = storage.join(run_dir, RUN_INIT)
    if not storage.exists(path):
        return None
    data = json.loads(storage.read_text(path))
    return data if isinstance(data, dict) else None

"""``simgraph pretrain CONFIG [key=value ...]``: pretrain an encoder with Ray Train.

Loads and validates the config, then runs :func:`components.runs.recipe.run_pretraining`: it holds
the run dir's one-writer lock (``components.runs.run_dir.writing_run``, the one way into a run dir
for ``simgraph pretrain``, ``simgraph run`` and every sweep trial); the dataset dir is checked
against what the loss needs before any Ray work; the run dir ``storage/name`` is prepared
(``config.yaml`` written on the first run; a re-run with the same name must match it, except
keys that may change on a resume such as ``train.epochs``, and resumes from the latest
complete checkpoint); Ray Train V2 runs the recipe (:class:`components.runs.worker.PretrainRecipe`)
on ``scaling.num_workers`` workers; the per-epoch metrics table is printed at the end.

**One writer per run dir.** The lock ``<storage>/.<name>.lock`` (beside the run dir) is held
from before ``config.yaml`` is read until training ends: a second ``simgraph pretrain`` (or
``simgraph run``, or a sweep trial) of the same run while the first trains is refused in one
line naming the first (host, pid, since) — it would otherwise resume the same checkpoints,
prune the first one's and take over its worker records — and two runs started together with
different configs cannot both pass the config check (it reads, compares and writes
``config.yaml`` under the lock). A lock left by a killed run is taken over, saying so. For an
object-store ``storage`` the lock is a file in this user's staging folder: it keeps out a
second run on the same machine only (docs/reliability.md).

A run dir that exists is used only when it is one (``config.yaml``, ``dataset.json`` or a
checkpoint in it); a non-empty folder of other files is refused naming them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components.config import PretrainConfig, load_config
from components.errors import run_command
from components.runs.recipe import PretrainError, history_table, run_pretraining

table = history_table


def run(cfg: PretrainConfig, echo: bool = True) -> list[dict[str, Any]]:
    """:func:`components.runs.recipe.run_pretraining`, which holds the run dir's lock (module
    docstring).

    Raises:
        RunError: another process holds the run dir, or what ``run_pretraining`` raises.
    """
    return run_pretraining(cfg, echo, command="pretrain")


def main(config: str, overrides: Sequence[str]) -> int:
    return run_command("pretrain", lambda: run(load_config(config, PretrainConfig, overrides)))


__all__ = ["PretrainError", "main", "run", "table"]

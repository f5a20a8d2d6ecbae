"""``simgraph pretrain CONFIG [key=value ...]``: pretrain an encoder with Ray Train.

Loads and validates the config, then runs :func:`components.recipe.run_pretraining`: the
dataset dir is checked against what the loss needs before any Ray work; the run dir
``storage/name`` is prepared (``config.yaml`` written on the first run; a re-run with the same
name must match it, except keys that may change on a resume such as ``train.epochs``, and
resumes from the latest complete checkpoint); Ray Train V2 runs the recipe
(:class:`components.recipe.PretrainRecipe`) on ``scaling.num_workers`` workers; the per-epoch
metrics table is printed at the end.
"""

from __future__ import annotations

from collections.abc import Sequence

from components.config import PretrainConfig, load_config
from components.errors import run_command
from components.recipe import PretrainError, history_table, run_pretraining

run = run_pretraining
table = history_table


def main(config: str, overrides: Sequence[str]) -> int:
    return run_command("pretrain", lambda: run(load_config(config, PretrainConfig, overrides)))


__all__ = ["PretrainError", "main", "run", "table"]

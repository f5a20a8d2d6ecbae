"""``simgraph pretrain CONFIG [key=value ...]``: pretrain an encoder with Ray Train.

Driver, top to bottom:

1. Load and validate the config, then the dataset dir against what the loss needs (labels,
   a class graph, captions) — before any Ray work (:func:`components.run_dir.check_dataset`).
2. Prepare the run dir ``storage/name`` (:func:`components.run_dir.prepare_run_dir`):
   ``config.yaml`` is written on the first run; a re-run with the same name must match it
   (except keys that may change on a resume, e.g. ``train.epochs``, ``scaling.*``) and resumes
   from the latest complete checkpoint.
3. Ray Train V2 ``TorchTrainer`` (:func:`components.recipe.make_trainer`) runs the pretraining
   recipe (:class:`components.recipe.PretrainRecipe`) on ``scaling.num_workers`` workers, on a
   local Ray started for the job or the ``RAY_ADDRESS`` cluster. ``FailureConfig(max_failures)``
   restarts the group from the latest checkpoint.
4. Print the per-epoch metrics table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components.config import PretrainConfig, load_config
from components.errors import describe, run_command
from components.recipe import make_trainer
from components.run_dir import (
    RunError,
    absolute_paths,
    check_dataset,
    finished_history,
    prepare_run_dir,
)


class PretrainError(RunError):
    """Training started but did not finish; the message says where, and the last complete
    checkpoint stays in the run dir."""


def run(cfg: PretrainConfig, echo: bool = True) -> list[dict[str, Any]]:
    """Train (or resume) the run; returns its per-epoch metrics history.

    Raises:
        RunError: bad dataset or run dir (checked before Ray starts).
        PretrainError: training failed (the message says where; the last good checkpoint
            stays in the run dir).
    """
    from components.checkpoint import load_state
    from components.session import ray_session
    from components.storage import display

    cfg = absolute_paths(cfg)
    facts = check_dataset(cfg)
    run_dir = prepare_run_dir(cfg)
    history = finished_history(run_dir, cfg.train.epochs)
    if history is not None:
        if echo:
            print(f"simgraph: run {cfg.name!r} is already complete ({len(history)} epochs)")
            print(table(history))
        return history
    if echo and facts.knn_note:
        print(f"simgraph: online kNN is off for this run ({facts.knn_note})")
    with ray_session(None):
        trainer = make_trainer(cfg, run_dir, facts)
        try:
            result = trainer.fit()
        except Exception as e:  # noqa: BLE001 - Ray wraps the worker's error
            raise PretrainError(
                f"training {cfg.name!r} failed: {describe(e)}\n"
                f"completed checkpoints stay in {display(run_dir)}; re-run the same command to "
                "resume"
            ) from None
    if result.checkpoint is None:
        raise PretrainError(f"run {cfg.name!r} finished without a checkpoint")
    with result.checkpoint.as_directory() as d:
        history = load_state(d)["history"]
    if echo:
        print(table(history))
        print(f"run dir: {display(run_dir)}")
    return history


def table(history: Sequence[dict[str, Any]]) -> str:
    cols = ["epoch", "loss", "lr", "knn_top1", "samples_per_s", "data_wait", "time_s"]
    lines = [" ".join(f"{c:>13}" for c in cols)]
    for row in history:
        cells = []
        for c in cols:
            v = row.get(c, float("nan"))
            cells.append(f"{v:>13d}" if isinstance(v, int) else f"{v:>13.4g}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def main(config: str, overrides: Sequence[str]) -> int:
    return run_command("pretrain", lambda: run(load_config(config, PretrainConfig, overrides)))


__all__ = ["PretrainError", "main", "run", "table"]

"""What may change when a run resumes, and whether it can: the keys a re-run may change
(:data:`RESUMABLE_CHANGES`; any other difference makes it another run: :func:`config_diff`),
those among them that move the learning rate (:data:`LR_CHANGES`, :func:`resume_changes`,
:func:`describe_changes`: an elastic resume re-places the schedule), and the check before any
Ray work that a checkpoint's samples seen lie within the new config's schedule
(:func:`check_resume`, :func:`past_the_schedule`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from components.config import ConfigError, PretrainConfig, flatten, from_dict, to_dict
from components.runs.checkpoints import latest_complete
from components.runs.errors import RunError

if TYPE_CHECKING:
    from components.runs.dataset_checks import RunFacts

# Keys that may differ when a run is resumed (longer training, other hardware, logging).
# Those that move the LR (LR_CHANGES: another number of workers is another global batch) are
# honoured by re-placing the restored schedule where a run started with the new values is
# after the same samples (PretrainRecipe._continue_schedule: elastic resume).
RESUMABLE_CHANGES = (
    "train.epochs", "train.log_every_steps", "scaling.", "checkpoint.keep",
    "knn.every_epochs", "data.num_workers", "data.os_cache", "data.jit", "data.stage",
    "storage", "tracking.", "recipe.",  # recipe: descriptive only
    # What a diverged run is told to change before it resumes from its last good checkpoint.
    "optim.lr", "train.amp", "train.grad_clip",
    # Memory, not the schedule: the same batch per step in k encoder chunks (another GPU may
    # need another k); only BatchNorm's per-chunk statistics change with it.
    "train.accumulate",
    # The online linear probe reads detached features: it never changes the encoder's
    # training (turned on at a resume, it starts fresh).
    "probe.",
)


# Resumable keys that move the learning rate: a resume re-places the restored schedule where a
# run started with the new values is after the same samples (components.runs.worker, elastic
# resume) and says so, naming these.
LR_CHANGES = ("scaling.num_workers", "optim.lr", "train.epochs")


def resume_changes(stored: dict[str, Any], cfg: PretrainConfig) -> list[tuple[str, Any, Any]]:
    """``(key, old, new)`` for each of :data:`LR_CHANGES` that differs between the config a
    checkpoint stores (a config dict, or a flat record of dotted keys: ``meta.json``'s
    ``shape``) and the one resuming it (``("scaling.num_workers", 1, 8)``)."""
    old = (dict(stored) if any("." in k for k in stored)  # a flat record (meta.json's shape)
           else flatten(_with_defaults(stored)))
    new = flatten(to_dict(cfg))
    return [(k, old[k], new[k]) for k in LR_CHANGES if k in old and old[k] != new[k]]


def _value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def describe_changes(changed: list[tuple[str, Any, Any]]) -> str:
    """``scaling.num_workers 1 -> 8, optim.lr 0.2 -> 0.1``."""
    return ", ".join(f"{k} {_value(a)} -> {_value(b)}" for k, a, b in changed)


def train_steps_per_epoch(cfg: PretrainConfig, train_samples: int) -> int:
    """Optimiser steps per epoch of ``cfg`` on ``train_samples`` training images: the
    training loader's length (:func:`components.data.reader.rank_order` with ``drop_last``
    keeps a multiple of ``scaling.num_workers × data.batch_size``; ``train.steps_per_epoch``
    caps it)."""
    steps = train_samples // (cfg.scaling.num_workers * cfg.data.batch_size)
    cap = cfg.train.steps_per_epoch
    return steps if cap is None else min(steps, cap)


def past_the_schedule(cfg: PretrainConfig, samples: int, changed: list[tuple[str, Any, Any]],
                      global_batch: int, total_steps: int) -> str:
    """Why a checkpoint that has seen ``samples`` cannot resume under ``cfg`` (a schedule of
    ``total_steps`` steps of ``global_batch``), and what to do instead."""
    per_epoch = max(1, total_steps // max(1, cfg.train.epochs)) * global_batch
    shape = [(k, a) for k, a, _ in changed if k == "scaling.num_workers"]
    ways = [f"resume it with {k}={_value(a)} (as it was)" for k, a in shape]
    ways += [f"raise train.epochs to at least {-(-samples // per_epoch)}",
             "start a new run (a new name=)"]
    return (f"run {cfg.name!r} cannot resume"
            + (f" with {describe_changes(changed)}" if changed else "")
            + f": its checkpoint has seen {samples} samples, past the end of this config's "
            f"schedule ({total_steps} steps of global batch {global_batch} = "
            f"{total_steps * global_batch} samples in train.epochs={cfg.train.epochs}), where "
            f"no step of a run started with it has an LR; {', or '.join(ways)}")


def _with_defaults(d: dict[str, Any]) -> dict[str, Any]:
    """A stored config with the keys added since it was written filled in at their defaults
    (which keep the old behaviour), so an older run still resumes and evaluates; a config
    that no longer loads is compared as it is."""
    try:
        return to_dict(from_dict(PretrainConfig, d))
    except (ConfigError, TypeError):
        return d


def config_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two config dicts (either side may lack a key;
    keys added to the config classes later count as their defaults), ignoring
    :data:`RESUMABLE_CHANGES`: what makes two configs different runs. Values are compared
    without the credentials of their URIs (:func:`components.io.storage.redacted`: what is
    stored): the same place reached with other credentials is the same run."""
    from components.io.storage import redacted

    a, b = flatten(_with_defaults(redacted(old))), flatten(_with_defaults(redacted(new)))
    return sorted(k for k in set(a) | set(b)
                  if a.get(k) != b.get(k) and not k.startswith(RESUMABLE_CHANGES))


def check_resume(cfg: PretrainConfig, facts: RunFacts, run_dir: str) -> None:
    """Before any Ray work: whether the run dir's newest complete checkpoint can resume under
    ``cfg`` — its samples seen (``meta.json``) within the schedule of ``cfg``'s shape (the
    recipe checks again from ``state.pt``, also for checkpoints older than the record).

    Raises:
        RunError: the samples seen are past the end of ``cfg``'s schedule
            (:func:`past_the_schedule`: what changed and what to do).
    """
    from components.runs.checkpoint import meta_at
    from components.training.optim import schedule_position

    done = latest_complete(run_dir)
    meta = {} if done is None else meta_at(done[1])
    samples, shape = meta.get("samples"), meta.get("shape")
    if not isinstance(samples, int) or not isinstance(shape, dict):
        return
    steps = train_steps_per_epoch(cfg, facts.splits.get("train", 0))
    global_batch = cfg.data.batch_size * cfg.scaling.num_workers
    total = steps * cfg.train.epochs
    if steps and schedule_position(samples, global_batch) > total:
        raise RunError(past_the_schedule(cfg, samples, resume_changes(shape, cfg),
                                         global_batch, total))

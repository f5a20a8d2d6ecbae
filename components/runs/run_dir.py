"""The run dir, one owner for its format: ``<storage>/<name>/`` holds

* ``config.yaml`` — the run's whole config, written on the first start, without the
  credentials of any URI in it; a re-run must match it except
  :data:`~components.runs.resume.RESUMABLE_CHANGES` (:func:`prepare_run_dir`,
  :func:`read_run_config`, :func:`components.runs.resume.config_diff`);
* ``dataset.json`` — the identity of the data it trains on; a re-run must find the same data
  (:func:`~components.data.identity.dataset_identity`,
  :func:`~components.runs.dataset_checks.check_same_dataset`);
* ``epoch_NNNNN/`` checkpoints: named, listed, published, pruned and the newest complete one
  found by :mod:`components.runs.checkpoints` (inside each, :mod:`components.runs.checkpoint`'s
  ``state.pt`` + ``meta.json`` holding a :class:`~components.runs.checkpoint.TrainingState`);
* ``metrics.csv`` and ``tb/`` (rank 0's per-epoch metrics), ``workers/rank<r>.json``, and the
  trackers' run ids (:data:`MLFLOW_RUN_ID`, :data:`WANDB_RUN_ID`: a resume continues the same
  tracker run).

A run is prepared through one function, :func:`prepare_run`: the driver-side checks before any
Ray work (:func:`~components.runs.dataset_checks.check_dataset` →
:class:`~components.runs.dataset_checks.RunFacts`), the run dir created or checked, and
whether it has already finished. Whatever trains in a run dir — ``simgraph pretrain`` and
``simgraph run`` (``components.runs.recipe.run_pretraining``), each sweep trial and confirmation run
— calls it only through :func:`writing_run`, which holds the run dir's one-writer lock and
claims the folder around it for as long as the run trains. Read back by ``evaluate`` /
``export`` / ``embed`` / a sweep's confirmation through one reader, :func:`load_run`: a typed
:class:`LoadedRun` giving the run's config, a verified checkpoint's state, its encoder and its
dataset."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from components.config import ConfigError, PretrainConfig, from_dict, to_dict
from components.config.loading import safe_load
from components.errors import SimgraphError
from components.runs.checkpoints import CHECKPOINT_PREFIX, finished_history, latest_complete
from components.runs.dataset_checks import RunFacts, check_dataset, check_same_dataset
from components.runs.errors import RunError
from components.runs.resume import check_resume, config_diff

if TYPE_CHECKING:
    from components.data.reader import DatasetInfo
    from components.models.encoders import Encoder
    from components.runs.checkpoint import TrainingState

RUN_CONFIG = "config.yaml"
RUN_DATASET = "dataset.json"  # the dataset_identity a run started on (resumes must match)
METRICS_CSV = "metrics.csv"
# The trackers' files in a run dir are their owner's (components.training.tracking).


def absolute_paths(cfg: PretrainConfig, base: str | Path | None = None) -> PretrainConfig:
    """Local dataset and storage paths made absolute, relative ones against ``base`` (default:
    :func:`components.io.paths.base_dir`): Ray Train workers and Tune trials run in other working
    directories. URIs (``s3://`` …) are left as they are."""
    from components.io.paths import resolve_path

    init = cfg.model.init
    return dataclasses.replace(
        cfg, storage=resolve_path(cfg.storage, base),
        data=dataclasses.replace(cfg.data, dataset=resolve_path(cfg.data.dataset, base)),
        model=cfg.model if init is None else dataclasses.replace(
            cfg.model, init=resolve_path(init, base)),
    )


class CorruptRunConfig(RunError):
    """A run dir's ``config.yaml`` cannot be parsed (a partial copy, an edit gone wrong)."""


def read_run_config(run_dir: str) -> dict[str, Any] | None:
    """The run dir's ``config.yaml`` as a dict; ``None`` when there is none.

    Raises:
        CorruptRunConfig: the file is not UTF-8 YAML holding a mapping (the message names it).
        storage.StorageError: it cannot be read.
    """
    from components.io import storage

    path = storage.join(run_dir, RUN_CONFIG)
    if not storage.exists(path):
        return None
    try:
        data = safe_load(storage.read_text(path), storage.display(path))
    except (UnicodeDecodeError, yaml.YAMLError, ConfigError) as e:
        reason = str(e).splitlines()[0]
        raise CorruptRunConfig(f"{storage.display(path)} is corrupt ({reason})") from None
    if not isinstance(data, dict):
        raise CorruptRunConfig(f"{storage.display(path)} is corrupt (not a mapping of config "
                               "keys)")
    return data


def checkpoint_config(run_dir: str) -> tuple[str, dict[str, Any]] | None:
    """(checkpoint dir, the config stored in it) of the newest complete checkpoint, or None:
    what a run dir with a corrupt ``config.yaml`` still says about its run."""
    from components.runs.checkpoint import TrainingState, local_copy

    done = latest_complete(run_dir)
    if done is None:
        return None
    with local_copy(done[1]) as d:
        return done[1], TrainingState.load(d).config


def prepare_run_dir(cfg: PretrainConfig, dataset: dict[str, Any] | None = None) -> str:
    """Create ``storage/name`` (a path or URI) with ``config.yaml``, or check a re-run
    against it; returns the run dir. ``dataset``: the :func:`dataset_identity` the run is
    about to read (:attr:`RunFacts.dataset`): written to ``dataset.json`` on the first start,
    and a re-run must match it (a run dir from before ``dataset.json`` is checked against its
    newest complete checkpoint).

    Raises:
        RunError: the run dir holds another run's config (names the differing keys), the
            dataset changed since the run started (:func:`check_same_dataset`), or the
            storage cannot be written.
    """
    from components.io import storage

    run_dir = storage.join(cfg.storage, cfg.name)
    path = storage.join(run_dir, RUN_CONFIG)
    new = to_dict(cfg)
    try:
        storage.makedirs(run_dir)
        try:
            stored = read_run_config(run_dir)
        except CorruptRunConfig as e:  # the checkpoints still hold the run's config
            found = checkpoint_config(run_dir)
            stored = None if found is None else found[1]
            from components.runtime import console

            console.say(f"[simgraph] warning: {e}; " + (
                f"checked against {storage.display(found[0])}'s config instead and rewritten"
                if found is not None else "no checkpoint to lose: rewritten"))
        if stored is not None:
            diff = config_diff(stored, new)
            if diff:
                raise RunError(
                    f"run {cfg.name!r} in {storage.display(cfg.storage)} was started with a "
                    f"different config ({', '.join(diff[:6])} differ); re-running a name "
                    "resumes it, so choose a new name= or restore those values"
                )
        record = dataset is not None and _check_run_dataset(cfg, run_dir, dataset)
        # Never the credentials of a URI (storage, data.dataset, a tracker's URI): they are
        # used, not stored (a resume finds them in its own config or the environment).
        storage.write_text(path, yaml.safe_dump(storage.redacted(new), sort_keys=False))
        if record:
            storage.write_text(storage.join(run_dir, RUN_DATASET),
                               json.dumps(dataset, sort_keys=True))
    except storage.StorageError as e:
        raise RunError(f"cannot use storage {storage.display(cfg.storage)}: {e}") from None
    return run_dir


def _check_run_dataset(cfg: PretrainConfig, run_dir: str, dataset: dict[str, Any]) -> bool:
    """:func:`check_same_dataset` against what the run dir says it trained on; returns whether
    ``dataset.json`` is still to be written."""
    from components.io import storage

    path = storage.join(run_dir, RUN_DATASET)
    if storage.exists(path):
        trained_on = json.loads(storage.read_text(path))
    else:  # a fresh run, or one started before dataset.json: its newest checkpoint says
        trained_on = None
        done = latest_complete(run_dir)
        if done is not None:
            from components.runs.checkpoint import TrainingState, local_copy

            with local_copy(done[1]) as d:
                trained_on = TrainingState.load(d).dataset
    check_same_dataset(cfg.name, storage.display(cfg.data.dataset), trained_on, dataset)
    return not storage.exists(path)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreparedRun:
    """A run ready to train: what :func:`prepare_run` checked and made.

    Attributes:
        cfg: the config, local paths absolute.
        facts: what the workers need to know about the dataset.
        run_dir: ``storage/name`` (a path or URI), created or checked.
        finished: the history when the run already trained ``train.epochs`` epochs (nothing
            to do), else ``None``.
    """

    cfg: PretrainConfig
    facts: RunFacts
    run_dir: str
    finished: list[dict[str, Any]] | None


def prepare_run(cfg: PretrainConfig, base: str | Path | None = None) -> PreparedRun:
    """Everything before training, for ``simgraph pretrain`` and each sweep trial alike —
    called through :func:`writing_run`, which holds the run dir's lock around it: local paths
    made absolute (against ``base``, default :func:`components.io.paths.base_dir`),
    the dataset checked against the loss (:func:`check_dataset`), a configured tracker's
    package present, the run dir created or checked against the config and data it started
    with (:func:`prepare_run_dir`), and whether it already finished.

    Raises:
        RunError: bad dataset, run dir, storage or tracker setup (before any Ray work).
    """
    from components.io import storage
    from components.runs.init_checks import check_run_init, record_run_init

    cfg = absolute_paths(cfg, base)
    facts = check_dataset(cfg)
    # model.init's keys against the model (meta device) before the run dir is touched
    resuming = latest_complete(storage.join(cfg.storage, cfg.name)) is not None
    facts = dataclasses.replace(facts, init=check_run_init(cfg, resuming))
    if cfg.tracking.mlflow:
        from components.training.tracking import require_mlflow

        require_mlflow("tracking.mlflow=true")
    if cfg.tracking.wandb:
        from components.training.tracking import require_wandb

        require_wandb("tracking.wandb=true")
    run_dir = prepare_run_dir(cfg, facts.dataset)
    record_run_init(run_dir, cfg.name, facts.init)
    finished = finished_history(run_dir, cfg.train.epochs)
    if finished is None:
        check_resume(cfg, facts, run_dir)
    return PreparedRun(cfg=cfg, facts=facts, run_dir=run_dir, finished=finished)


RUN_REFUSAL = ("another simgraph pretrain, run or sweep trial is training this run; wait for "
               "it, stop it, or choose another name=")


def _is_run_dir(_path: str, names: list[str]) -> bool:
    """Whether a non-empty folder's entries make it a run dir (``config.yaml``,
    ``dataset.json`` or a checkpoint, complete or being published)."""
    return bool({RUN_CONFIG, RUN_DATASET} & set(names)) or any(
        n.lstrip(".").startswith(CHECKPOINT_PREFIX) for n in names)


@contextlib.contextmanager
def writing_run(cfg: PretrainConfig, base: str | Path | None = None, *,
                command: str = "pretrain", wait_s: float = 0.0,
                waiting: str = "") -> Iterator[PreparedRun]:
    """:func:`prepare_run` holding the run dir's one-writer lock for the whole block: the one
    way into a run dir for whatever trains in it (``simgraph pretrain`` and ``simgraph run``
    through :func:`components.runs.recipe.run_pretraining`, each sweep trial and confirmation run).

    The lock (:func:`components.io.storage.writer_lock`: ``<storage>/.<name>.lock``, a file in
    this user's staging folder for a URI) is taken before ``config.yaml`` is read and released
    when the block ends — or by the kernel when this process dies — so a second writer can
    neither resume the same checkpoints, prune the first one's and take over its worker
    records, nor pass the config check beside it. Then a folder of someone else's files is
    refused (:func:`components.io.storage.claim_dir`): ``config.yaml``, checkpoints and worker
    records are never written among them. ``command`` names the caller in that refusal;
    ``wait_s`` > 0 waits that long for a held lock (a sweep trial whose previous process is
    still going), then gives up saying ``waiting``.

    Raises:
        RunError: another process holds the run dir (naming it), the folder holds files
            simgraph did not write, or what :func:`prepare_run` raises.
    """
    from components.io import storage

    run_dir = storage.join(absolute_paths(cfg, base).storage, cfg.name)
    with storage.writer_lock(run_dir, "the run dir", error=RunError, refusal=RUN_REFUSAL,
                             wait_s=wait_s, waiting=waiting):
        storage.claim_dir(run_dir, "run", _is_run_dir, error=RunError, command=command,
                          fix="choose another name= or storage=", mark=False)
        yield prepare_run(cfg, base)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoadedRun:
    """A run read back by :func:`load_run`: its config, a verified checkpoint's state and that
    checkpoint's path; :meth:`encoder` and :meth:`dataset` build what the reading commands
    score, export or embed with, failing with the reading command's error type ``error``."""

    config: PretrainConfig
    state: TrainingState
    checkpoint: str
    error: type[SimgraphError] = RunError

    def encoder(self) -> Encoder:
        """The checkpoint's backbone and projector (no classifier head, no objective: the one
        route from a run to its encoder, :func:`~components.models.encoders.encoder_from_state`),
        in eval mode on the CPU.

        Raises:
            ``error``: the checkpoint's model does not fit the run config's model section.
        """
        from components.models.encoders import EncoderStateError, encoder_from_state

        try:
            return encoder_from_state(self.config.model, self.state.model,
                                      self.config.data.augment.resolution)
        except EncoderStateError as e:
            raise self.error(str(e)) from None

    def dataset(self) -> DatasetInfo:
        """The labelled dataset the run trained on (a URI or ``data.stage``: a verified
        node-local copy), checked to be that data by its identity.

        Raises:
            ``error``: the dataset cannot be read, has no labels, or is not the data the run
                trained on.
        """
        from components.data.identity import dataset_identity, identity_diff
        from components.data.reader import DatasetError, DatasetInfo
        from components.data.staging import local_dataset
        from components.io.storage import StorageError

        data = self.config.data
        try:
            info = DatasetInfo.load(local_dataset(data.dataset, data.stage, data.stage_dir))
        except (DatasetError, StorageError) as e:
            raise self.error(str(e)) from None
        if not info.classes:
            raise self.error(f"{info.root} has no labels: kNN, the probe and the graph "
                             "metrics need labelled data")
        trained_on = self.state.dataset
        now = dataset_identity(info.manifest)
        if trained_on is not None and trained_on != now:
            raise self.error(
                f"{info.root} does not hold the data this run trained on "
                f"({', '.join(identity_diff(trained_on, now)) or 'its identity'} differ: "
                "rebuilt or replaced since, e.g. by `simgraph preprocess --overwrite`); the "
                f"run's config names it as data.dataset={data.dataset!r}: restore the dataset "
                "the run trained on there (rebuild it with the parameters it was built with), "
                "or train a run on the new one")
        return info


def load_run(run_dir: str | Path, checkpoint: str | Path | None = None, *,
             error: type[SimgraphError] = RunError, command: str = "evaluate") -> LoadedRun:
    """A finished (or interrupted) run as the commands that read one need it
    (:class:`LoadedRun`): its config, a verified checkpoint's
    :class:`~components.runs.checkpoint.TrainingState` (``checkpoint``, or the newest complete
    one) and that checkpoint's path. A corrupt ``config.yaml`` falls back to the checkpoint's
    config with a warning on stderr (``simgraph <command>: warning: ...``). ``error`` and
    ``command``: the reading command's error type (``EvaluateError``, ``ExportError``,
    ``EmbedError``: its exit code) and name.

    Raises:
        ``error`` (the command's error type): not a run dir, no complete checkpoint, an
            unreadable checkpoint or one without a model, or a checkpoint written under
            another config than the run dir's.
    """
    import sys

    from components.io import storage
    from components.runs.checkpoint import CheckpointError, TrainingState, local_copy

    run_dir, checkpoint = str(run_dir), None if checkpoint is None else str(checkpoint)
    shown = storage.display(run_dir)
    try:
        raw = read_run_config(run_dir)
    except CorruptRunConfig as e:  # the checkpoints still hold the run's config
        stored = checkpoint_config(run_dir)
        if stored is None:
            raise error(f"{e}, and the run has no complete checkpoint to read its config "
                        "from") from None
        print(f"simgraph {command}: warning: {e}; using the config stored in "
              f"{storage.display(stored[0])}", file=sys.stderr)
        raw = stored[1]
    except storage.StorageError as e:
        raise error(f"cannot read {shown}: {e}") from None
    if raw is None:
        raise error(f"{shown} is not a run dir (no {RUN_CONFIG}); give the storage/name dir "
                    "that `simgraph pretrain` wrote")
    cfg = from_dict(PretrainConfig, raw)
    if checkpoint is None:
        found = latest_complete(run_dir)
        if found is None:
            raise error(f"{shown} has no complete checkpoint: pretrain it first (or let the "
                        "interrupted run resume)")
        checkpoint = found[1]
    try:
        with local_copy(checkpoint) as d:
            state = TrainingState.load(d)
    except (CheckpointError, storage.StorageError) as e:
        raise error(str(e)) from None
    diff = config_diff(state.config, dataclasses.asdict(cfg))
    if diff:
        raise error(
            f"checkpoint {storage.display(checkpoint)} was written by another config than "
            f"{shown} ({', '.join(diff[:5])} differ); {command} it with its own run dir")
    return LoadedRun(config=cfg, state=state, checkpoint=str(checkpoint), error=error)

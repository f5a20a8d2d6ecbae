"""The ``simgraph`` command: one entry point dispatching to the pipelines.

Available now:

* ``simgraph validate CONFIG [key=value ...]`` — load a config file with dotted overrides,
  check every key, type and range, and print the resolved config (exit 2 on an error); a
  pretrain config also gets its GPU-hours by the paper estimate (docs/gpu.md).

* ``simgraph preprocess CONFIG [key=value ...] [--overwrite]`` — images → FFCV dataset dir.

* ``simgraph inspect DATASET_DIR [--out DIR] [--per-class N]`` — ``report.md`` + PNGs: samples
  per class as stored, class counts, captions, duplicates, skipped items.

* ``simgraph pretrain CONFIG [key=value ...]`` — Ray Train DDP pretraining; re-running the
  same run name resumes it from its latest complete checkpoint.

* ``simgraph preview CONFIG [key=value ...] [--out PNG]`` — a PNG grid of a batch of training
  views exactly as the workers receive them (look at the augmentations before training).

* ``simgraph run CONFIG [key=value ...]`` — preprocess, then several pretraining runs, then a
  comparison table (``make demo`` runs ``pipelines/configs/demo.yaml``).

* ``simgraph evaluate RUN_DIR [RUN_DIR ...] [--checkpoint PATH] [--projector] [--out DIR]
  [--labels MAP.yaml] [--no-baseline] [--device cpu|cuda:N]`` — kNN, linear probe, graph
  metrics, plots (an embedding map, nearest neighbours) and a report per run with the
  random-init encoder as a baseline row, and a comparison of several; ``--labels`` scores
  against groups of the classes (coarse labels).

* ``simgraph export RUN_DIR [--checkpoint DIR] [--format safetensors|torchscript|onnx]
  [--projector] [--out DIR]`` — the backbone (+ projector) as files that load without
  simgraph, with ``config.json`` and ``model_card.md`` (default ``<run>/export/``).

* ``simgraph embed RUN_DIR --data DATASET_DIR_OR_IMAGE_FOLDER [--split S] [--projector]
  [--checkpoint DIR] [--device cpu|cuda:N] --out FILE.parquet`` — one embedding per image
  (the evaluation centre view) of a dataset dir's split(s) or of a folder of images, with
  ids / paths, labels, classes and captions, as a Parquet file.

* ``simgraph sweep SPACE.yaml [--resume] [key=value ...]`` — Ray Tune + Optuna over
  pretraining, conditional per-loss spaces from ``search_spaces/*.yaml``, ASHA, resume.

* ``simgraph submit [--address URL] [--base-dir DIR] [--pip none|project] -- COMMAND ...`` —
  send any of the commands above to a Ray cluster through the Ray Jobs API, shipping this
  project as the job's ``working_dir``; streams the job's logs (docs/cluster.md).

Every command honours ``RAY_ADDRESS`` (use that cluster instead of starting a local Ray) and
``SIMGRAPH_BASE_DIR`` (what relative data and storage paths mean).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from components.config import LossSection, load_config, to_dict

# What ``simgraph validate`` recognises, by the top-level keys that name each kind.
FILE_KINDS = {
    "sweep": "name, base, space (search_spaces/)",
    "run": "preprocess, pretrain, runs (pipelines/configs/demo.yaml)",
    "preprocess": "output, source, ... (pipelines/configs/data/)",
    "pretrain": "name, data, model, loss, optim, ... (pipelines/configs/pretrain/)",
    "loss": "loss only (pipelines/configs/losses/)",
}

# ``evaluate`` / ``embed``: where they read and compute (components.data.devices.resolve_device).
DEVICE_HELP = ("cpu, cuda or cuda:N (cuda = cuda:0); default: cuda:0 when torch sees a GPU, "
               "else cpu")


def config_kind(config: str) -> str:
    """Which kind of file ``config`` is (a key of :data:`FILE_KINDS`), from its top-level keys.

    Raises:
        ConfigError: unreadable, or keys that fit no kind (the message lists the kinds).
    """
    from components.config import ConfigError, load_yaml

    keys = set(load_yaml(config))
    if {"base", "space"} <= keys:
        return "sweep"
    if "runs" in keys:
        return "run"
    if "output" in keys or "source" in keys:
        return "preprocess"
    if {"name", "data"} <= keys:
        return "pretrain"
    if keys == {"loss"}:
        return "loss"
    kinds = "; ".join(f"{k} ({v})" for k, v in FILE_KINDS.items())
    raise ConfigError(f"{config}: cannot tell which kind of config this is from its top-level "
                      f"keys {sorted(keys)}; simgraph validate knows: {kinds}")


def config_class(config: str) -> type:
    """The dataclass of a preprocess / pretrain / run / loss file (:func:`config_kind`)."""
    from components.config import PipelineConfig, PreprocessConfig, PretrainConfig

    return {"run": PipelineConfig, "preprocess": PreprocessConfig, "pretrain": PretrainConfig,
            "loss": LossSection}[config_kind(config)]


def validate(config: str, overrides: Sequence[str]) -> int:
    """Check a file as the command that reads it would, before any work: print it resolved;
    a pretrain config whose dataset dir exists is also checked against it (what the loss
    needs, batch size) and its run summary printed (effective LR, steps, warnings); a sweep's
    every branch is built; a run config loads every run's pretrain config."""
    from components.errors import run_command
    from components.io.storage import redacted

    def body() -> None:
        kind = config_kind(config)
        if kind == "sweep":
            _validate_sweep(config, overrides)
            return
        if kind == "run":
            from components.config import load_pipeline

            pre, runs = load_pipeline(config, overrides)
            print(yaml.safe_dump(redacted({"preprocess": to_dict(pre), "runs": {
                k: {"name": v.name, "loss": to_dict(v.loss), "epochs": v.train.epochs,
                    "storage": v.storage} for k, v in runs.items()}}), sort_keys=False), end="")
            print(f"# simgraph validate: run config, {len(runs)} pretraining runs, all valid")
            return
        cfg: Any = load_config(config, config_class(config), overrides)
        print(yaml.safe_dump(redacted(to_dict(cfg)), sort_keys=False), end="")
        if kind == "pretrain":
            _check_pretrain_dataset(cfg)
            _print_paper_estimate(cfg)

    return run_command("validate", body)


def _validate_sweep(path: str, overrides: Sequence[str]) -> None:
    from components.io.storage import redacted
    from components.search_space import load_sweep

    sweep = load_sweep(path, overrides)  # builds every branch's trial config at its corners
    params = {p: {k: v for k, v in dataclasses.asdict(d).items() if v not in (None, False)}
              for p, d in sweep.parameters().items()}
    print(yaml.safe_dump(redacted({
        "name": sweep.name, "base": str(sweep.base_path), "overrides": list(sweep.overrides),
        "metric": sweep.metric, "mode": sweep.mode, "num_samples": sweep.num_samples,
        "searcher": dataclasses.asdict(sweep.searcher),
        "scheduler": dataclasses.asdict(sweep.scheduler), "parameters": params,
    }), sort_keys=False), end="")
    print(f"# simgraph validate: sweep, {len(params)} parameters, "
          f"{len(sweep.branches())} branch(es), every branch builds a valid pretrain config")


def _check_pretrain_dataset(cfg: Any) -> None:
    from components.io import storage
    from components.io.paths import is_uri
    from components.runs.dataset_checks import check_dataset
    from components.runs.run_dir import absolute_paths
    from components.runs.summary import run_summary

    cfg = absolute_paths(cfg)
    if not is_uri(cfg.data.dataset) and not Path(cfg.data.dataset).exists():
        print(f"# simgraph validate: dataset {storage.display(cfg.data.dataset)} does not "
              "exist yet; not checked against it (simgraph pretrain checks it before starting)")
        return
    facts = check_dataset(cfg)  # RunError: the same refusal pretrain would give
    if cfg.model.init:  # its keys against the model, as pretrain's fresh start checks them
        import dataclasses

        from components.runs.init_checks import check_run_init

        facts = dataclasses.replace(facts, init=check_run_init(cfg, False))
    print("\n".join("# " + line for line in run_summary(
        cfg, facts, storage.join(cfg.storage, cfg.name)).splitlines()))


def _print_paper_estimate(cfg: Any) -> None:
    """The GPU-hours of ``cfg`` by the paper estimate (docs/gpu.md), on the train split of
    the built dataset (its manifest, as :func:`_check_pretrain_dataset` reads it) or else on
    ``recipe.train_images``; one line saying what is missing when neither is known, and one
    line (never a traceback) when counting the model's FLOPs fails: the estimate is advice,
    the config is valid either way."""
    from components.data.reader import DatasetError, DatasetInfo
    from components.io import storage
    from components.io.paths import is_uri
    from components.runs.estimate import estimate_lines
    from components.runs.run_dir import absolute_paths

    dataset = absolute_paths(cfg).data.dataset
    n, source = 0, ""
    if not is_uri(dataset) and Path(dataset).exists():  # a URI: not read here
        try:
            n = DatasetInfo.load(dataset).splits.get("train", 0)
            source = f"{n:,} train images in {storage.display(dataset)}'s manifest"
        except DatasetError:
            n = 0
    if not n and cfg.recipe.train_images:
        n = cfg.recipe.train_images
        source = f"recipe.train_images = {n:,} (the paper's train set; dataset not built here)"
    if not n:
        print("# paper estimate: needs the built dataset (data.dataset) or "
              "recipe.train_images, the number of training images")
        return
    try:
        lines = estimate_lines(cfg, n, source)
    except Exception as e:  # noqa: BLE001 - advice only: one line, never a traceback
        print(f"# paper estimate: not available ({type(e).__name__}: {str(e)[:200]})")
        return
    print("\n".join(lines))


class _CommandParser(argparse.ArgumentParser):
    """argparse, except that a command's dotted overrides may also follow its flags
    (``preprocess cfg.yaml --overwrite split.seed=1``: argparse stops a positional list at
    the first flag and calls the rest unrecognized)."""

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        ns, extra = self.parse_known_args(args, namespace)
        if extra and isinstance(getattr(ns, "overrides", None), list) and all(
                "=" in a and not a.startswith("-") for a in extra):
            ns.overrides = [*ns.overrides, *extra]
        elif extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return ns


def build_parser() -> argparse.ArgumentParser:
    """Every ``simgraph`` subcommand and its arguments (``simgraph submit`` checks the command
    it sends with this same parser)."""
    parser = _CommandParser(prog="simgraph", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("validate", help="check a config file and print it resolved")
    p.add_argument("config", help="YAML config file")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. loss.tau_s=0.2")
    p = commands.add_parser("preprocess", help="images -> FFCV dataset dir (Ray Data)")
    p.add_argument("config", help="YAML preprocess config (see pipelines/configs/data/)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. image.max_side=64")
    p.add_argument("--overwrite", action="store_true", help="rebuild from scratch")
    p = commands.add_parser("inspect", help="report.md + PNGs describing a dataset dir")
    p.add_argument("dataset", help="a dataset dir written by simgraph preprocess")
    p.add_argument("--out", help="where report.md goes (default: DATASET/inspect)")
    p.add_argument("--per-class", type=int, default=8, help="samples per class in the grid")
    p = commands.add_parser("pretrain", help="pretrain an encoder with Ray Train (resumable)")
    p.add_argument("config", help="YAML pretrain config (see pipelines/configs/pretrain/)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. loss.tau=0.2")
    p = commands.add_parser("preview", help="a PNG grid of training views as workers see them")
    p.add_argument("config", help="YAML pretrain config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.augment.scale=[0.5,1]")
    p.add_argument("--out", help="PNG path (default: preview-<name>.png)")
    p.add_argument("--images", type=int, default=16, help="rows: images of the first batch")
    p.add_argument("--epoch", type=int, default=0, help="which epoch's views (0-based)")
    p.add_argument("--rank", type=int, default=0, help="which worker's share")
    p.add_argument("--tile", type=int, default=96, help="px per tile")
    p = commands.add_parser("run", help="preprocess + several pretraining runs + a table")
    p.add_argument("config", help="YAML pipeline config (e.g. pipelines/configs/demo.yaml)")
    p.add_argument("overrides", nargs="*", help="dotted overrides of the pipeline config")
    p = commands.add_parser("evaluate", help="kNN, probe, graph metrics and reports of runs")
    p.add_argument("run_dirs", nargs="+", help="run dirs (storage/name) to evaluate")
    p.add_argument("--checkpoint", help="a checkpoint dir (default: the run's newest)")
    p.add_argument("--projector", action="store_true", help="projector instead of backbone")
    p.add_argument("--out", help="where the comparison of several runs goes")
    p.add_argument("--labels", help="score against groups of the classes: a YAML map "
                                    "'class: group' (e.g. pipelines/configs/labels/"
                                    "fashion_mnist_coarse.yaml), or depth:N to group "
                                    "folder classes (source.label_depth) by their first N "
                                    "folders; report in <run>/eval-<name>")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the random-init encoder of each run's config (by default its "
                        "kNN and probe are a 'random init' row, with each run's gain over it)")
    p.add_argument("--device", help=DEVICE_HELP)
    p = commands.add_parser("export", help="a run's encoder as files that load without simgraph")
    p.add_argument("run_dir", help="the run dir (storage/name) to export")
    p.add_argument("--checkpoint", help="a checkpoint dir (default: the run's newest)")
    p.add_argument("--format", default="safetensors",
                   help="safetensors (default), torchscript or onnx")
    p.add_argument("--projector", action="store_true", help="also the projector")
    p.add_argument("--out", help="output dir (default: RUN_DIR/export)")
    p = commands.add_parser("embed", help="one embedding per image of a dataset dir or an "
                                          "image folder, as a Parquet file")
    p.add_argument("run_dir", help="the run dir (storage/name) whose encoder embeds")
    p.add_argument("--data", required=True,
                   help="a dataset dir (simgraph preprocess) or a folder of images (class "
                        "sub-folders as source.kind: folder, and/or images at its root)")
    p.add_argument("--split", help="with a dataset dir: this split only (default: every "
                                   "split with samples)")
    p.add_argument("--projector", action="store_true", help="projector instead of backbone")
    p.add_argument("--checkpoint", help="a checkpoint dir (default: the run's newest)")
    p.add_argument("--out", required=True, help="the Parquet file to write (path or URI)")
    p.add_argument("--device", help=DEVICE_HELP)
    p = commands.add_parser("sweep", help="Ray Tune + Optuna sweep over pretraining")
    p.add_argument("space", help="search space YAML (see search_spaces/)")
    p.add_argument("overrides", nargs="*", help="overrides of the sweep file, e.g. num_samples=8")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep")
    p.add_argument("--trust-sweep-dir", action="store_true",
                   help="with --resume: unpickle Ray Tune's state in the sweep dir without "
                        "checking who could have written it (a shared or URI sweep dir whose "
                        "writers you trust, or one whose driver was killed)")
    p.add_argument("--confirm", action="store_true",
                   help="only the confirmation stage (confirm: {top, seeds, split}) of a "
                        "finished sweep: retrain its best settings with fresh seeds, score "
                        "them on the test split; re-running resumes it")
    p = commands.add_parser(
        "submit", help="send a simgraph command to a Ray cluster (Ray Jobs API)",
        description="Send `simgraph COMMAND ...` to a Ray cluster as a Ray job, shipping this "
                    "project as the job's working_dir, and stream its logs. Example: simgraph "
                    "submit --address http://HEAD:8265 --base-dir /shared/simgraph -- sweep "
                    "search_spaces/xclr_temperature.yaml")
    p.add_argument("--address", help="the cluster's dashboard URL (default: $RAY_ADDRESS, "
                                     "else http://127.0.0.1:8265)")
    p.add_argument("--base-dir", help="a directory every node shares: relative data / storage "
                                      "paths of the command mean this directory on the cluster")
    p.add_argument("--pip", choices=["none", "project"], default="none",
                   help="pip packages for the job: none (the cluster has the project installed, "
                        "as examples/cluster/ sets it up) or project (its Python dependencies)")
    p.add_argument("--runtime-env", help="YAML file merged into the job's runtime_env")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment variable for the job (repeatable)")
    p.add_argument("--job-id", help="submission id (default: simgraph-<command>-<time>)")
    p.add_argument("--no-wait", action="store_true", help="return after submitting")
    p.add_argument("--skip-check", action="store_true",
                   help="do not load the command's configs here before sending it")
    p.add_argument("--include", action="append", default=[], metavar="PATH",
                   help="send this project-relative file or folder although it was refused "
                        "(its name looks like a secret, .gitignore ignores it, or it is a "
                        "symlink out of the project); repeatable")
    p.add_argument("job", nargs=argparse.REMAINDER,
                   help="-- then the simgraph command, e.g. -- pretrain CONFIG key=value")
    verbose_help = ("show everything Ray and torch print (default: quiet — our own lines, "
                    "errors and real warnings; see components/runtime/console.py)")
    parser.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    for sub in commands.choices.values():  # also after the command: simgraph pretrain C -v
        sub.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                         help=verbose_help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from components.runtime.console import set_verbose

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose:  # else SIMGRAPH_VERBOSE decides
        set_verbose(True)
    if args.command == "validate":
        return validate(args.config, args.overrides)
    if args.command == "preprocess":
        from pipelines import preprocess

        return preprocess.main(args.config, args.overrides, overwrite=args.overwrite)
    if args.command == "inspect":
        from pipelines import inspect_dataset as inspect

        return inspect.main(args.dataset, args.out, args.per_class)
    if args.command == "pretrain":
        from pipelines import pretrain

        return pretrain.main(args.config, args.overrides)
    if args.command == "preview":
        from pipelines import preview

        return preview.main(args.config, args.overrides, args.out, args.images, args.epoch,
                            args.rank, args.tile)
    if args.command == "evaluate":
        from pipelines import evaluate

        return evaluate.main(args.run_dirs, args.checkpoint, args.projector, args.out,
                             args.labels, baseline=not args.no_baseline, device=args.device)
    if args.command == "export":
        from pipelines import export

        return export.main(args.run_dir, args.checkpoint, args.format, args.projector, args.out)
    if args.command == "embed":
        from pipelines import embed

        return embed.main(args.run_dir, args.data, args.out, args.split, args.projector,
                          args.checkpoint, device=args.device)
    if args.command == "sweep":
        from pipelines import sweep

        return sweep.main(args.space, args.overrides, resume=args.resume,
                          trust=args.trust_sweep_dir, confirm_only=args.confirm)
    if args.command == "run":
        from pipelines import run

        return run.main(args.config, args.overrides)
    if args.command == "submit":
        from pipelines import submit

        return submit.main(args, parser)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())

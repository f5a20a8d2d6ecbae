"""``simgraph run`` configs: one dataset, several pretraining runs (the demo, "same data,
several losses" studies)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from components.config.checks import ConfigError
from components.config.loading import load_config
from components.config.preprocess import PreprocessConfig
from components.config.pretrain import PretrainConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """``simgraph run``: preprocess once, then pretrain one run per entry of ``runs``.

    ``preprocess`` and ``pretrain`` are config files (paths relative to this file);
    ``runs`` maps a short name to the dotted overrides of that run (the run is named
    ``<prefix>-<short name>``); ``overrides`` apply to every run first.
    """

    preprocess: str
    pretrain: str
    runs: dict[str, list[str]]
    prefix: str = "run"
    overrides: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.runs:
            raise ConfigError("runs must name at least one pretraining run")
        for name, overrides in self.runs.items():
            if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
                raise ConfigError(f"runs.{name} must be a list of key=value strings")


def load_pipeline(config: str | Path, overrides: Sequence[str] = ()) -> tuple[
        PreprocessConfig, dict[str, PretrainConfig]]:
    """The preprocess config and one pretrain config per run (by short name), all loaded and
    validated, so a typo in the last run fails before any work starts.

    Raises:
        ConfigError: any of them is invalid (names the file and key).
    """
    spec = load_config(config, PipelineConfig, overrides)
    here = Path(config).parent
    pre = load_config(here / spec.preprocess, PreprocessConfig)
    runs = {
        name: load_config(here / spec.pretrain, PretrainConfig,
                          [*spec.overrides, *extra, f"name={spec.prefix}-{name}",
                           f"data.dataset={pre.output}"])
        for name, extra in spec.runs.items()
    }
    return pre, runs

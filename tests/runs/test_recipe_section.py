"""``recipe:`` is descriptive: a run dir stored without it (or with other values) resumes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from components.config import PretrainConfig, from_dict, to_dict
from components.runs.errors import RunError
from components.runs.resume import config_diff
from components.runs.run_dir import RUN_CONFIG, prepare_run_dir


def _cfg(storage: Path, **recipe: object) -> PretrainConfig:
    return from_dict(PretrainConfig, {"name": "run", "storage": str(storage),
                                      "data": {"dataset": "data/x"}, "recipe": dict(recipe)})


def test_a_config_stored_without_a_recipe_section_resumes_with_one(tmp_path: Path) -> None:
    old = to_dict(_cfg(tmp_path))
    del old["recipe"]  # as a run dir written before the section existed stores it
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RUN_CONFIG).write_text(yaml.safe_dump(old))
    new = _cfg(tmp_path, name="supcon", paper="Khosla 2020", train_images=1_281_167)
    assert config_diff(old, to_dict(new)) == []
    prepare_run_dir(new)  # no RunError
    assert yaml.safe_load((run_dir / RUN_CONFIG).read_text())["recipe"]["train_images"] == \
        1_281_167
    prepare_run_dir(_cfg(tmp_path, name="renamed"))  # and it may change again


def test_other_keys_still_make_another_run(tmp_path: Path) -> None:
    prepare_run_dir(_cfg(tmp_path))
    other = from_dict(PretrainConfig, {"name": "run", "storage": str(tmp_path),
                                       "data": {"dataset": "data/y"}})
    with pytest.raises(RunError, match="data.dataset"):
        prepare_run_dir(other)

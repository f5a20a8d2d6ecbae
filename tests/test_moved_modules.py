"""Issue 41: modules moved into packages stay importable by their old names, so what was
pickled before the move (Tune's ``tuner.pkl`` callbacks, searcher state, a user's pickles)
still loads, and old imports keep working (``components/__init__.py``'s ``MOVED``)."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys

import pytest

import components

PACKAGES_NOW = {"components.models", "components.training", "components.export"}


@pytest.mark.parametrize("old", sorted(components.MOVED))
def test_an_old_module_name_is_the_moved_module(old: str) -> None:
    new = importlib.import_module(components.MOVED[old])
    got = importlib.import_module(old)
    if old in PACKAGES_NOW:  # the package: what the old module had comes from the new one
        public = [n for n in vars(new) if not n.startswith("_")
                  and getattr(getattr(new, n), "__module__", None) == new.__name__]
        assert public
        for name in public:
            assert getattr(got, name) is getattr(new, name), name
        with pytest.raises(AttributeError, match=f"module '{old}' has no attribute 'nope'"):
            _ = got.nope  # type: ignore[attr-defined]
    else:
        assert got is new


def _pickled_under(obj: object, old: str, new: str) -> bytes:
    """``obj`` pickled (protocol 0: module and name as text lines) as if its class had lived
    in ``old``."""
    data = pickle.dumps(obj, protocol=0)
    assert f"c{new}\n".encode() in data
    return data.replace(f"c{new}\n".encode(), f"c{old}\n".encode())


@pytest.mark.parametrize(("old", "new", "name"), [
    ("components.tune_loggers", "components.sweep.tune_loggers", "DeferredTBXLoggerCallback"),
    ("components.models", "components.models.encoders", "ConvNet"),
    ("components.export", "components.export.formats", "ExportError"),
    ("components.export", "components.export.architecture", "Architecture"),
    ("components.recipe", "components.runs.recipe", "run_pretraining"),
    ("pipelines.sweep", "components.sweep.tuner", "trial_fn"),  # Tune's trainable
    ("pipelines.sweep", "components.sweep.confirm_runs", "confirm_fn"),
    # a run's error in Tune's error.pkl (or Ray's), pickled before run_dir.py was split
    ("components.runs.run_dir", "components.runs.errors", "RunError"),
    ("components.run_dir", "components.runs.errors", "RunError"),
    # a trial's error in Tune's error.pkl, pickled before reader.py was split
    ("components.data.reader", "components.data.reader_errors", "LoaderError"),
    ("components.data.reader", "components.data.reader_errors", "LoaderStalledError"),
    ("components.data.reader", "components.data.reader_errors", "ReaderSettingError"),
])
def test_a_pickle_naming_an_old_module_loads(old: str, new: str, name: str) -> None:
    obj = getattr(importlib.import_module(new), name)
    assert pickle.loads(_pickled_under(obj, old, new)) is obj


def test_old_names_resolve_in_a_fresh_interpreter_without_importing_the_new_first() -> None:
    """What a resumed sweep's unpickling does: the old name first, in a new process."""
    code = ("import importlib, pickle\n"
            "m = importlib.import_module('components.run_dir')\n"
            "assert m.__name__ == 'components.runs.run_dir', m.__name__\n"
            "from components.storage import redact\n"
            "from components.training import build_model\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"

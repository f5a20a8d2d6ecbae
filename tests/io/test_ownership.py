"""simgraph deletes or overwrites only what it wrote (issue 39, found-item 1 and principle 1).

Outputs go to a new or empty folder (marked ``.simgraph-owner.json`` until the output's own
record exists) or to one simgraph wrote (a dataset's ``manifest.json``, an export's
``config.json``); a folder holding anything else is refused in one line naming what is there,
before anything is written. Each test feeds the mistake and checks that the user's files are
byte-identical afterwards:

* ``simgraph export --out .`` in a project folder (its own ``model.py``, ``config.json``);
* a user's ``model.py`` dropped beside an earlier export, or an exported file edited since;
* ``simgraph preprocess`` (with and without ``--overwrite``) into a folder that is not a
  dataset (``classes.json``, ``captions.json``, notes), or holds another tool's
  ``manifest.json``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from components.io import storage
from pipelines.cli import main
from tests.support.datasets import run_with_checkpoint, synthetic_dataset, tiny_run_config
from tests.support.helpers import one_line_error as _one_line
from tests.support.helpers import tree_digests as _tree


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_dataset(tmp_path_factory.mktemp("own") / "ds", classes=2,
                             train_per_class=16, val_per_class=2, size=16)


@pytest.fixture(scope="module")
def run(data: Path) -> Path:
    return run_with_checkpoint(data, data.parent / "runs", "r")


def _user_folder(root: Path) -> Path:
    root.mkdir()
    (root / "model.py").write_text("# my own model, not simgraph's\nclass Net: ...\n")
    (root / "config.json").write_text('{"mine": true}\n')
    (root / "notes.txt").write_text("do not lose\n")
    return root


# ---------------------------------------------------------------------------------------------
# simgraph export


def test_export_into_a_folder_of_user_files_is_refused(
        run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project = _user_folder(tmp_path / "project")
    before = _tree(project)
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(project)]) == 1
    err = _one_line(capsys)
    assert f"{project} is not empty and simgraph did not write it" in err
    assert "config.json, model.py, notes.txt" in err and "--out" in err
    assert _tree(project) == before  # nothing replaced, deleted, or added (no mark)
    assert sorted(p.name for p in project.iterdir()) == ["config.json", "model.py",
                                                          "notes.txt"]


def test_export_keeps_a_user_model_py_dropped_beside_an_earlier_export(
        run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An ONNX export, then the user's own model.py beside it: a safetensors export would
    overwrite it and an ONNX one delete it (it is an export file name the ONNX export does
    not write) — both refused, naming it."""
    out = tmp_path / "exp"
    assert main(["export", str(run), "--out", str(out), "--format", "onnx"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.onnx",
                                                      "model_card.md"]  # the mark is gone
    (out / "model.py").write_text("# mine\n")
    before = _tree(out)
    for fmt in ("safetensors", "onnx"):
        capsys.readouterr()
        assert main(["export", str(run), "--out", str(out), "--format", fmt]) == 1, fmt
        err = _one_line(capsys)
        assert f"{out} holds model.py, which the export there (config.json) did not write" in err
        assert _tree(out) == before, fmt


def test_export_refuses_to_replace_an_exported_file_edited_since(
        run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "exp"
    assert main(["export", str(run), "--out", str(out)]) == 0  # safetensors + model.py
    with open(out / "model.py", "a") as f:
        f.write("# my fix\n")
    (out / "README.md").write_text("mine\n")  # not an export file name: never touched
    before = _tree(out)
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(out), "--format", "onnx"]) == 1
    assert "holds model.py, which the export there (config.json) did not write or which " \
           "changed since" in _one_line(capsys)
    assert _tree(out) == before
    # Its own files unchanged, an export replaces them and leaves the user's README alone.
    (out / "model.py").unlink()
    assert main(["export", str(run), "--out", str(out), "--format", "onnx"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.onnx",
                                                      "model_card.md"]
    assert (out / "README.md").read_text() == "mine\n"


# ---------------------------------------------------------------------------------------------
# simgraph preprocess


def _preprocess(tmp_path: Path, out: Path) -> Path:
    src = tmp_path / "src" / "cat"
    src.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "pre.yaml"
    cfg.write_text(yaml.safe_dump({"output": str(out),
                                   "source": {"kind": "folder", "path": str(src.parent)},
                                   "captions": {"enabled": False}}))
    return cfg


@pytest.mark.parametrize("overwrite", [False, True])
def test_preprocess_into_a_folder_that_is_not_a_dataset_is_refused(
        tmp_path: Path, overwrite: bool, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "classes.json").write_text('["my", "labels"]\n')
    (out / "captions.json").write_text('{"a": "my captions"}\n')
    (out / "notes.txt").write_text("do not lose\n")
    before = _tree(out)
    capsys.readouterr()
    assert main(["preprocess", str(_preprocess(tmp_path, out)),
                 *(["--overwrite"] if overwrite else [])]) == 1
    err = _one_line(capsys)
    assert f"{out} is not empty and simgraph did not write it (captions.json, classes.json, " \
           "notes.txt)" in err
    assert "output=" in err
    assert _tree(out) == before
    assert sorted(p.name for p in out.iterdir()) == ["captions.json", "classes.json",
                                                      "notes.txt"]  # no lock, no mark


def test_preprocess_into_a_folder_with_another_tools_manifest_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "proj"
    out.mkdir()
    (out / "manifest.json").write_text('{"name": "my web app", "version": 3}\n')
    before = _tree(out)
    capsys.readouterr()
    assert main(["preprocess", str(_preprocess(tmp_path, out)), "--overwrite"]) == 1
    assert "is not empty and simgraph did not write it (manifest.json)" in _one_line(capsys)
    assert _tree(out) == before


# ---------------------------------------------------------------------------------------------
# simgraph pretrain


def test_pretrain_into_a_folder_of_user_files_is_refused(
        data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``storage=. name=project``: the project folder is not made a run dir."""
    project = _user_folder(tmp_path / "project")
    before = _tree(project)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(tiny_run_config(
        data, tmp_path, name="project",
        scaling={"num_workers": 1, "cpus_per_worker": 1.0, "host": "in_process"})))
    capsys.readouterr()
    assert main(["pretrain", str(cfg)]) == 1
    err = _one_line(capsys)
    assert f"{project} is not empty and simgraph did not write it (config.json, model.py, " \
           "notes.txt)" in err and "name=" in err
    assert _tree(project) == before
    assert sorted(p.name for p in project.iterdir()) == ["config.json", "model.py",
                                                          "notes.txt"]


# ---------------------------------------------------------------------------------------------
# The mark itself (components/io/storage.py: claim_dir / release_dir)


def test_a_new_folder_is_claimed_and_recognised_until_released(tmp_path: Path) -> None:
    class Refused(Exception):
        pass

    def claim(path: Path, kind: str = "dataset") -> bool:
        return storage.claim_dir(path, kind, None, error=Refused, command="test", fix="fix")

    new = tmp_path / "new"
    assert claim(new) is False  # new: claimed, marked
    assert (new / storage.OWNER_MARK).exists()
    (new / "shards").mkdir()  # a build killed before its manifest: still simgraph's
    assert claim(new) is True
    with pytest.raises(Refused, match=r"is a simgraph dataset folder \(.simgraph-owner.json\)"
                                      ": simgraph test refuses to write there; fix"):
        claim(new, "export")
    storage.release_dir(new)
    with pytest.raises(Refused, match=r"is not empty and simgraph did not write it \(shards\)"):
        claim(new)  # without its mark or a manifest, nothing says the folder is simgraph's
    empty = tmp_path / "empty"
    empty.mkdir()
    assert claim(empty) is False
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(Refused, match="cannot use .* it is a file"):
        claim(afile)

"""Bad input is one line (naming the file and what to do) or a counted skip — never a
traceback, never lost work (issue 29). Each case feeds the mistake as a user would make it
and checks the message, the exit code and that nothing was lost."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from components.config import PretrainConfig, from_dict, to_dict
from components.runs.dataset_checks import check_dataset
from components.runs.errors import RunError
from components.runs.run_dir import RUN_CONFIG, prepare_run_dir
from pipelines.cli import main
from tests.support.datasets import model_checkpoint, synthetic_dataset, tiny_run_config


@pytest.mark.parametrize("command", ["validate", "pretrain", "preprocess", "sweep", "run"])
def test_a_config_that_is_not_utf8_is_one_line_and_exit_2(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "run.yaml"
    bad.write_bytes(b"name: x\ndata:\n  dataset: /tmp/d\xff\xfe\n")
    assert main([command, str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"{bad} is not UTF-8 text (byte 0xff on line 3): save it as UTF-8, or "
                        "check that it is the config you meant"), err
    assert len(err.splitlines()) == 1 and err.count(str(bad)) == 1


def _run_dir(tmp_path: Path) -> tuple[PretrainConfig, Path, Path]:
    data = synthetic_dataset(tmp_path / "ds", size=16, train_per_class=8, val_per_class=2)
    cfg = from_dict(PretrainConfig, tiny_run_config(data, tmp_path / "runs"))
    run_dir = Path(prepare_run_dir(cfg))
    return cfg, data, run_dir


def _checkpoint(cfg: PretrainConfig, run_dir: Path) -> None:
    from components.training.step import build_model

    facts = check_dataset(cfg)
    model, _ = build_model(cfg.model, cfg.loss, facts.num_classes, None, facts.caption_dim)
    model_checkpoint(cfg, run_dir, model, facts.dataset)


def test_a_corrupt_run_config_falls_back_to_the_checkpoints(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg, data, run_dir = _run_dir(tmp_path)
    _checkpoint(cfg, run_dir)
    (run_dir / RUN_CONFIG).write_text("name: run\ndata: {dataset: [unclosed\n")
    # Resuming with another config is still refused: the checkpoint's config is compared.
    other = from_dict(PretrainConfig,
                      tiny_run_config(data, tmp_path / "runs", optim__momentum=0.5))
    with pytest.raises(RunError, match=r"optim\.momentum differ"):
        prepare_run_dir(other)
    assert (run_dir / "epoch_00001" / "state.pt").exists()
    # The same run resumes, and config.yaml is written again.
    prepare_run_dir(cfg)
    out = capsys.readouterr().out
    assert f"{run_dir / RUN_CONFIG} is corrupt" in out and "epoch_00001's config" in out
    assert yaml.safe_load((run_dir / RUN_CONFIG).read_text()) == to_dict(cfg)


def test_evaluate_reads_a_run_with_a_corrupt_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from components.runs.scoring import EvaluateError, load_run

    cfg, _, run_dir = _run_dir(tmp_path)
    (run_dir / RUN_CONFIG).write_bytes(b"\xff\xfe not yaml")
    with pytest.raises(EvaluateError, match=r"config.yaml is corrupt .*and the run has no "
                                            r"complete checkpoint"):
        load_run(run_dir)
    _checkpoint(cfg, run_dir)
    run = load_run(run_dir)
    assert run.config == cfg and run.checkpoint.endswith("epoch_00001") and run.state.epoch == 1
    assert "is corrupt" in capsys.readouterr().err


def test_a_truncated_split_file_is_named(tmp_path: Path) -> None:
    from components.data.reader import DatasetError, ViewLoader, set_jit

    data = synthetic_dataset(tmp_path / "ds", size=16, train_per_class=8, val_per_class=2)
    beton = data / "train.beton"
    with open(beton, "r+b") as f:
        f.truncate(beton.stat().st_size // 2)
    set_jit(False)
    try:
        with pytest.raises(DatasetError, match=rf"{beton} cannot be read as an FFCV file "
                                               r"\(ValueError: .*\): it is truncated or corrupt"):
            ViewLoader(beton, batch_size=4, views=1, num_workers=1)
    finally:
        set_jit(True)


def test_a_manifest_row_with_an_unreadable_scheme_is_a_counted_skip(tmp_path: Path) -> None:
    from components.data.sources import UNSUPPORTED_URI, SourceError, list_manifest

    (tmp_path / "a.png").write_bytes(b"")
    (tmp_path / "m.csv").write_text("path,label\na.png,cat\nhttp://example.org/b.png,dog\n"
                                    "s3://bucket/c.png,cat\n")
    got = list_manifest(str(tmp_path / "m.csv"))
    assert [it.path for it in got.items] == [str(tmp_path / "a.png"), "s3://bucket/c.png"]
    assert [(s.path, s.reason) for s in got.skipped] == [("http://example.org/b.png",
                                                          UNSUPPORTED_URI)]
    assert "http:// cannot be read: paths may be local or s3://" in got.skipped[0].detail
    with pytest.raises(SourceError, match=r"http://example.org/b.png: http:// cannot be read.*"
                                          r"set bad_input=skip to skip and count"):
        list_manifest(str(tmp_path / "m.csv"), on_bad_input="error")


@pytest.mark.parametrize("bug", [True, False])
def test_a_bug_in_a_worker_keeps_its_traceback(bug: bool, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A user error in a worker is one line; a bug also prints Ray's text, which holds every
    failed worker's traceback."""
    import contextlib

    from components.runs import recipe
    from components.runs.recipe import PretrainError
    from components.runtime import session

    data = synthetic_dataset(tmp_path / "ds", size=16, train_per_class=8, val_per_class=2)
    cfg = from_dict(PretrainConfig, tiny_run_config(data, tmp_path / "runs"))
    error: Exception = (RuntimeError("Training failed due to worker errors:\nTraceback (most "
                                     "recent call last):\n  File \"x.py\", line 1\nKeyError: 'k'")
                        if bug else RunError("the checkpoint is at step 9, past this run's 8"))

    class Trainer:
        def fit(self) -> None:
            raise error

    monkeypatch.setattr(session, "ray_session", lambda _: contextlib.nullcontext())
    monkeypatch.setattr(recipe, "make_trainer", lambda *a, **k: Trainer())
    with pytest.raises(PretrainError, match="completed checkpoints stay in"):
        recipe.run_pretraining(cfg, echo=False)
    err = capsys.readouterr().err
    assert ("Traceback (most recent call last)" in err) == bug

"""components.errors: one base class, dispatch by type through Ray's wrappers, one main()."""

from __future__ import annotations

import ast
import importlib
import pickle
from pathlib import Path

import pytest
import torch
from ray.train import WorkerGroupError

from components.config import ConfigError, PretrainConfig, load_config
from components.errors import NonFiniteError, SimgraphError, describe, root_cause, run_command
from components.io.storage import StorageError, StorageNotFoundError, read_bytes
from components.training.step import NonFiniteLossError

ROOT = Path(__file__).resolve().parents[1]


def _error_classes() -> list[tuple[str, str]]:
    """(module, class) of every ``class *Error`` defined in components/ and pipelines/."""
    out = []
    for path in sorted([*ROOT.glob("components/**/*.py"), *ROOT.glob("pipelines/*.py")]):
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.ClassDef) and node.name.endswith("Error")
                    and node.name != "SimgraphError"):
                mod = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                out.append((mod, node.name))
    return out


def test_every_error_class_is_a_simgraph_error_and_keeps_its_builtin() -> None:
    classes = _error_classes()
    assert len(classes) >= 17  # config, storage, dataset, checkpoint, each pipeline, ...
    for mod, name in classes:
        cls = getattr(importlib.import_module(mod), name)
        assert issubclass(cls, SimgraphError), f"{mod}.{name}"
        # `except ValueError` / `except RuntimeError` written before the base still catch it
        assert issubclass(cls, ValueError | RuntimeError), f"{mod}.{name}"
        e = cls("decode-failed", "message") if name == "ImageError" else cls("message")
        back = pickle.loads(pickle.dumps(e))  # errors cross Ray's process boundary
        assert type(back) is cls and str(back) == "message" and vars(back) == vars(e)


def test_root_cause_finds_the_worker_error_by_type() -> None:
    inner = NonFiniteLossError("epoch 2 step 7: the loss is nan (non-finite)")
    wrapped = WorkerGroupError("Training failed", {1: RuntimeError("other rank"), 0: inner})
    outer = RuntimeError("trial failed")
    outer.__cause__ = wrapped
    assert root_cause(outer) is inner
    assert describe(outer) == "NonFiniteLossError: epoch 2 step 7: the loss is nan (non-finite)"
    # no simgraph error anywhere: the innermost one, its last line (Ray puts its headline first)
    plain = RuntimeError("Traceback (most recent call last):\n  ...\nKeyError: 'x'")
    assert describe(plain) == "KeyError: 'x'"
    assert describe(ValueError("bad")) == "ValueError: bad"


def test_root_cause_looks_inside_a_ray_task_error_of_a_simgraph_error() -> None:
    """A Tune trial actor's error comes back as ``RayTaskError(NonFiniteLossError)``, which
    *is* a NonFiniteLossError whose message is Ray's traceback header: the cause is reported."""
    from ray.exceptions import RayTaskError

    inner = NonFiniteLossError("epoch 1 step 2: z has 512 non-finite value(s)")
    wrapped = RayTaskError("ray::ImplicitFunc.train()", "Traceback ...",
                           inner).as_instanceof_cause()
    assert isinstance(wrapped, NonFiniteLossError)  # why the wrapper must be skipped
    assert root_cause(wrapped) is inner
    assert describe(wrapped) == "NonFiniteLossError: epoch 1 step 2: z has 512 non-finite value(s)"


def test_objective_non_finite_input_is_a_typed_value_error() -> None:
    from components.objectives import ContrastiveBatch

    with pytest.raises(NonFiniteError, match="z has 2 non-finite"):
        ContrastiveBatch(z=torch.tensor([1.0, float("nan"), float("inf")]).view(3, 1, 1))
    assert issubclass(NonFiniteError, ValueError)


def test_storage_not_found_is_its_own_type(tmp_path: Path) -> None:
    with pytest.raises(StorageNotFoundError, match="not found"):
        read_bytes(tmp_path / "missing")
    with pytest.raises(StorageError, match="is a directory") as info:
        read_bytes(tmp_path)
    assert not isinstance(info.value, StorageNotFoundError)


def test_run_command_exit_codes_and_one_line(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command("x", lambda: None) == 0

    def bad_config() -> None:
        raise ConfigError("loss.tau=-1.0 is not allowed")

    assert run_command("pretrain", bad_config) == 2
    err = capsys.readouterr().err
    assert err == "simgraph pretrain: invalid config: loss.tau=-1.0 is not allowed\n"

    def failed() -> None:
        raise NonFiniteLossError("epoch 1: nan")

    assert run_command("pretrain", failed) == 1
    assert capsys.readouterr().err == "simgraph pretrain: epoch 1: nan\n"
    # a missing or broken config file is a config error, not a traceback
    assert run_command("pretrain", lambda: load_config(tmp_path / "no.yaml", PretrainConfig)) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "broken.yaml").write_text("name: [unclosed\n")
    assert run_command("pretrain", lambda: load_config(tmp_path / "broken.yaml",
                                                       PretrainConfig)) == 2
    assert "is not valid YAML" in capsys.readouterr().err

    def bug() -> None:
        raise KeyError("a bug keeps its traceback")

    with pytest.raises(KeyError):
        run_command("pretrain", bug)

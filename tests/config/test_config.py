"""Config loading: types, ranges, unknown keys, tagged loss sections, dotted overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components.config import (
    LOSS_CONFIGS,
    CoNeConfig,
    ConfigError,
    EpsSupInfoNCEConfig,
    LossSection,
    SupConConfig,
    XCLRConfig,
    apply_overrides,
    from_dict,
    load_config,
    set_values,
    to_dict,
)


def test_every_loss_name_round_trips() -> None:
    assert set(LOSS_CONFIGS) == {
        "simclr",
        "supcon",
        "xclr",
        "sincere",
        "eps_supinfonce",
        "cone",
        "ce",
        "clip",
    }
    for name, cls in LOSS_CONFIGS.items():
        cfg = from_dict(LossSection, {"loss": {"name": name}})
        assert isinstance(cfg.loss, cls)
        assert from_dict(LossSection, to_dict(cfg)) == cfg


def test_values_and_types() -> None:
    cfg = from_dict(LossSection, {"loss": {"name": "xclr", "tau": 1, "tau_s": "1e-3"}})
    assert cfg.loss == XCLRConfig(tau=1.0, tau_s=0.001)
    assert isinstance(cfg.loss.tau, float)


@pytest.mark.parametrize(
    ("loss", "message"),
    [
        ({"name": "supcon", "epsilon": 0.1}, "unknown key loss.epsilon for 'supcon'; allowed"),
        ({"name": "nope"}, "loss.name='nope' is not allowed: choose one of ce, clip, cone"),
        ({"name": "xclr", "tau": 0}, "loss.tau=0.0 is not allowed: it must be a finite number > 0"),
        ({"name": "xclr", "tau_s": -1}, "loss.tau_s=-1.0 is not allowed"),
        ({"name": "xclr", "tau": "hot"}, "loss.tau='hot' must be a number"),
        ({"name": "xclr", "tau": True}, "must be a number, not a boolean"),
        ({"name": "xclr", "graph": "wordnet"}, "loss.graph='wordnet' is not allowed: choose one"),
        ({"name": "eps_supinfonce", "epsilon": -0.1}, "loss.epsilon=-0.1 is not allowed"),
        ({"name": "cone", "lambda_sup": -1}, "loss.lambda_sup=-1.0 is not allowed"),
        ({"name": "cone", "bank_size": 0}, "loss.bank_size=0 is not allowed"),
        ({"name": "cone", "bank_size": 1.5}, "loss.bank_size=1.5 must be an integer"),
        ({"name": "supcon", "bank_size": -3}, "loss.bank_size=-3 is not allowed"),
        ({"name": "supcon", "variant": "both"}, "loss.variant='both' is not allowed"),
        ({"name": "ce", "label_smoothing": 2}, "must lie in [0.0, 1.0]"),
    ],
)
def test_bad_values_name_key_value_and_allowed(loss: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict(LossSection, {"loss": loss})
    assert message in str(err.value)


def test_unknown_top_level_key() -> None:
    with pytest.raises(ConfigError, match="unknown key los for LossSection; allowed keys: loss"):
        from_dict(LossSection, {"los": {}})


def test_overrides_parse_yaml_values_and_switch_loss_cleanly() -> None:
    base = {"loss": {"name": "supcon", "tau": 0.2, "variant": "in"}}
    data = apply_overrides(base, ["loss.tau=0.05", "loss.variant=out"])
    assert from_dict(LossSection, data).loss == SupConConfig(tau=0.05, variant="out")
    assert base["loss"]["tau"] == 0.2  # the input is not modified
    # Switching the loss drops the previous loss's parameters instead of failing on them.
    data = apply_overrides(base, ["loss.name=eps_supinfonce", "loss.epsilon=0.25"])
    assert from_dict(LossSection, data).loss == EpsSupInfoNCEConfig(epsilon=0.25)
    with pytest.raises(ConfigError, match="must look like key.path=value"):
        apply_overrides(base, ["loss.tau"])
    with pytest.raises(ConfigError, match="'tau' is a value, not a section"):
        apply_overrides(base, ["loss.tau.x=1"])
    # A value that is not YAML is a config error naming it (it was a raw parser traceback).
    with pytest.raises(ConfigError, match=r"the value '\[a=\[1,2\], b\]' is not valid YAML at "
                                          r"column 4.*quote list entries"):
        apply_overrides(base, ["overrides=[a=[1,2], b]"])
    quoted = apply_overrides(base, ["overrides=['a=[1,2]', b]"])
    assert quoted["overrides"] == ["a=[1,2]", "b"]
    # "key:" on a command line is a string, not YAML's one-key mapping {key: None} (was
    # "source.caption_key={'json': None} must be a string"); a mapping is written {a: 1}
    text = apply_overrides({}, ["source.caption_key=json:", "source.x=a: b", "m={a: 1}"])
    assert text == {"source": {"caption_key": "json:", "x": "a: b"}, "m": {"a": 1}}


def test_set_values_is_apply_overrides_without_text() -> None:
    """The typed counterpart of overrides: values are set as given (a string stays a string
    whatever YAML would make of it), a loss switch resets the section the same way."""
    base = {"loss": {"name": "supcon", "tau": 0.2, "variant": "in"}, "name": "x"}
    data = set_values(base, {"loss.name": "eps_supinfonce", "loss.epsilon": 0.25,
                             "name": "123"})
    assert data == apply_overrides(base, ["loss.name=eps_supinfonce", "loss.epsilon=0.25",
                                          "name='123'"])
    assert from_dict(LossSection, {"loss": data["loss"]}).loss == EpsSupInfoNCEConfig(
        epsilon=0.25)
    assert data["name"] == "123" and base["loss"]["tau"] == 0.2  # the input is not modified
    with pytest.raises(ConfigError, match="config path 'loss.tau.x': 'tau' is a value"):
        set_values(base, {"loss.tau.x": 1})
    with pytest.raises(ConfigError, match="config path 'loss..tau' has an empty key"):
        set_values(base, {"loss..tau": 1})


def test_load_config_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("loss:\n  name: cone\n  bank_size: 1000\n  top_n: 8\n")
    cfg = load_config(path, LossSection, ["loss.lambda_dc=0"])
    assert cfg.loss == CoNeConfig(bank_size=1000, top_n=8, lambda_dc=0.0)
    path.write_text("- just a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(path, LossSection)
    path.write_text("loss: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(Exception, match="could not determine a constructor"):
        load_config(path, LossSection)  # safe_load never runs code


def test_only_the_loss_section_switches_kind_by_name() -> None:
    from components.config import apply_overrides

    data = {"name": "a", "optim": {"name": "sgd", "lr": 0.5},
            "loss": {"name": "xclr", "tau_s": 0.2}}
    out = apply_overrides(data, ["name=b", "optim.name=lars", "loss.name=sincere"])
    assert out == {"name": "b", "optim": {"name": "lars", "lr": 0.5},
                   "loss": {"name": "sincere"}}


def test_config_diff_treats_keys_added_later_as_their_defaults() -> None:
    """A run stored before model.blocks / model.projector_bn / optim.schedule existed still
    resumes and evaluates; a real change is still a difference."""
    from components.config import PretrainConfig, from_dict, to_dict
    from components.runs.resume import config_diff

    new = to_dict(from_dict(PretrainConfig, {"name": "r", "data": {"dataset": "d"}}))
    old = {k: dict(v) if isinstance(v, dict) else v for k, v in new.items()}
    del old["model"]["blocks"], old["model"]["projector_bn"], old["optim"]["schedule"]
    assert config_diff(old, new) == []
    old["optim"]["momentum"] = 0.5
    assert config_diff(old, new) == ["optim.momentum"]
    old["model"]["backbone"] = "tiny"  # no longer loads: compared as stored
    assert "model.backbone" in config_diff(old, new)


def test_step_schedule_settings() -> None:
    from components.config import ConfigError, OptimConfig

    cfg = OptimConfig(schedule="step", step_epochs=[30, 40.5], step_gamma=0.2)
    assert cfg.step_epochs == [30, 40.5]
    with pytest.raises(ConfigError, match=r"schedule=step needs optim.step_epochs.*\[60, 80\]"):
        OptimConfig(schedule="step")
    with pytest.raises(ConfigError, match=r"step_epochs=\[40, 30\] is not allowed: give "
                                          "increasing epochs > 0"):
        OptimConfig(schedule="step", step_epochs=[40, 30])
    with pytest.raises(ConfigError, match=r"step_epochs=\[30\] is only used by "
                                          "optim.schedule=step \\(schedule is cosine\\)"):
        OptimConfig(step_epochs=[30])
    with pytest.raises(ConfigError, match="optim.step_gamma"):
        OptimConfig(schedule="step", step_epochs=[30], step_gamma=1.5)


def test_a_run_whose_loss_has_no_positive_is_refused(tmp_path: Path) -> None:
    """SimCLR with one view (its positive is the other view), or any batch loss contrasting
    one view with nothing (batch 1, one view, one worker): the loss is 0 every step and the
    run trained nothing, silently (metrics.csv: anchors_without_positive = every anchor)."""
    from components.config import PretrainConfig
    from tests.support.datasets import tiny_run_config

    def run(**over: Any) -> PretrainConfig:
        return from_dict(PretrainConfig, tiny_run_config(tmp_path, tmp_path, **over))

    with pytest.raises(ConfigError, match=r"loss.name='simclr' with data.views=1: .*use "
                                          r"data.views=2"):
        run(loss={"name": "simclr", "tau": 0.2}, data__views=1)
    one = {"data__views": 1, "data__batch_size": 1, "scaling": {"num_workers": 1}}
    with pytest.raises(ConfigError, match=r"contrasts one view with nothing"):
        run(loss={"name": "supcon", "tau": 0.2}, **one)
    # what does learn: two views, a batch of two, a memory bank, two workers, CE
    assert run(loss={"name": "supcon", "tau": 0.2}, data__views=1).data.views == 1
    assert run(loss={"name": "supcon", "tau": 0.2}, data__views=2, data__batch_size=1,
               scaling={"num_workers": 1})
    assert run(loss={"name": "supcon", "tau": 0.2, "bank_size": 64}, **one)
    assert run(loss={"name": "ce"}, **one)

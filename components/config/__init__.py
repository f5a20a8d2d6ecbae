"""Typed configuration: dataclasses loaded from YAML with dotted overrides.

Every config section is a dataclass. :func:`from_dict` turns a plain mapping (from
``yaml.safe_load``) into that dataclass, checking every key and type on the way; each
dataclass's ``__post_init__`` checks ranges. Every failure raises :class:`ConfigError`
naming the dotted key, the bad value and what is allowed, before any Ray work starts.

Loss sections are tagged unions: ``loss: {name: xclr, tau: 0.1, tau_s: 0.1}`` picks
:class:`XCLRConfig` by ``name``, so a parameter that the chosen loss does not have
(``epsilon`` for SupCon, say) is an error instead of being silently ignored.

Modules: :mod:`.checks` (``ConfigError``, range checks), :mod:`.loading` (YAML → dataclasses,
overrides), :mod:`.losses` (one dataclass per loss), :mod:`.preprocess`, :mod:`.pretrain` and
:mod:`.pipeline` (the sections of each command's file). Import from the package:
``from components.config import PretrainConfig, load_config``.

Example::

    cfg = load_config("run.yaml", LossSection, overrides=["loss.tau_s=0.2"])
"""

from components.config.checks import (
    ConfigError,
    check_at_least,
    check_gpu_share,
    check_in_range,
    check_non_negative,
    check_positive,
)
from components.config.loading import (
    TAGGED_SECTIONS,
    apply_overrides,
    flatten,
    from_dict,
    load_config,
    load_yaml,
    set_values,
    to_dict,
)
from components.config.losses import (
    LOSS_CONFIGS,
    TEMPERATURE_KEYS,
    CEConfig,
    CLIPConfig,
    CoNeConfig,
    ContrastiveConfig,
    EpsSupInfoNCEConfig,
    LossConfig,
    LossSection,
    SimCLRConfig,
    SINCEREConfig,
    SupConConfig,
    XCLRConfig,
)
from components.config.pipeline import PipelineConfig, load_pipeline
from components.config.preprocess import (
    CaptionConfig,
    DedupeConfig,
    ImageConfig,
    PreprocessConfig,
    SourceConfig,
    SplitConfig,
)
from components.config.pretrain import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    AugmentConfig,
    CheckpointSection,
    DataConfig,
    KNNConfig,
    ModelConfig,
    OptimConfig,
    PretrainConfig,
    ProbeConfig,
    RecipeSection,
    ScalingSection,
    TrackingConfig,
    TrainConfig,
    ViewGroup,
    check_wandb,
)

__all__ = [
    "AugmentConfig",
    "CEConfig",
    "CLIPConfig",
    "CaptionConfig",
    "CheckpointSection",
    "CoNeConfig",
    "ConfigError",
    "ContrastiveConfig",
    "DataConfig",
    "DedupeConfig",
    "EpsSupInfoNCEConfig",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageConfig",
    "KNNConfig",
    "LOSS_CONFIGS",
    "LossConfig",
    "LossSection",
    "ModelConfig",
    "OptimConfig",
    "PipelineConfig",
    "PreprocessConfig",
    "PretrainConfig",
    "ProbeConfig",
    "SINCEREConfig",
    "ScalingSection",
    "SimCLRConfig",
    "SourceConfig",
    "SplitConfig",
    "SupConConfig",
    "TAGGED_SECTIONS",
    "TEMPERATURE_KEYS",
    "TrackingConfig",
    "RecipeSection",
    "check_wandb",
    "TrainConfig",
    "ViewGroup",
    "XCLRConfig",
    "apply_overrides",
    "check_at_least",
    "check_gpu_share",
    "check_in_range",
    "check_non_negative",
    "check_positive",
    "flatten",
    "from_dict",
    "load_config",
    "load_pipeline",
    "load_yaml",
    "set_values",
    "to_dict",
]

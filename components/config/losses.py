"""Objective configs (``loss:``), one dataclass per loss, chosen by ``name`` (a tagged union)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal, Union, get_args

from components.config.checks import (
    check_at_least,
    check_in_range,
    check_non_negative,
    check_positive,
)

# Config keys that are temperatures (a loss's, the kNN monitor's): they must stay > 0 (sweep
# ranges are refused otherwise) and the papers use 0.05-0.5 (a pretrain run warns outside).
TEMPERATURE_KEYS = ("tau", "tau_s", "tau_sup", "tau_dc", "temperature")

# ---------------------------------------------------------------------------------------------
# Objective configs. Defaults are the papers' (cited per field).


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContrastiveConfig:
    """Options every batch-contrastive loss shares: temperature and an optional memory bank.

    ``bank_size > 0`` appends the last ``bank_size`` EMA-encoder keys to the candidates
    (MoCo-style; SupCon's memory variant used 8192, supcon.txt Sec. 4); ``ema_momentum`` is
    the EMA's starting momentum, cosine-increased to 1.
    """

    tau: float = 0.1  # SimCLR / SupCon default temperature
    bank_size: int = 0  # 0 = no memory bank
    ema_momentum: float = 0.996

    def __post_init__(self) -> None:
        check_positive("loss.tau", self.tau)
        check_at_least("loss.bank_size", self.bank_size, 0)
        check_in_range("loss.ema_momentum", self.ema_momentum, 0.0, 1.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimCLRConfig(ContrastiveConfig):
    """InfoNCE / SimCLR (NT-Xent): positives are the other views of the same image."""

    name: Literal["simclr"] = "simclr"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SupConConfig(ContrastiveConfig):
    """SupCon: ``variant='out'`` is supcon.txt Eq. 2 (the paper's choice), ``'in'`` Eq. 3."""

    name: Literal["supcon"] = "supcon"
    variant: Literal["out", "in"] = "out"


@dataclasses.dataclass(frozen=True, kw_only=True)
class XCLRConfig(ContrastiveConfig):
    """X-CLR (xclr.txt Sec. 2.2): soft targets softmax(G / tau_s) from a similarity graph.

    ``graph='class'`` indexes a class-similarity matrix by labels (ImageNet recipe, A.12);
    ``graph='caption'`` uses cosine similarity of per-sample caption embeddings (CC3M recipe).
    """

    name: Literal["xclr"] = "xclr"
    tau_s: float = 0.1  # best value in xclr.txt A.4.2 / Fig. 3c
    graph: Literal["class", "caption"] = "class"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("loss.tau_s", self.tau_s)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SINCEREConfig(ContrastiveConfig):
    """SINCERE (sincere.txt Sec. 3.3): same-class terms left out of the denominator."""

    name: Literal["sincere"] = "sincere"


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpsSupInfoNCEConfig(ContrastiveConfig):
    """eps-SupInfoNCE (Barbano et al. 2023, sincere.txt Sec. 3.5): SINCERE with a margin."""

    name: Literal["eps_supinfonce"] = "eps_supinfonce"
    epsilon: float = 0.1  # cosine units; 0 is SINCERE exactly

    def __post_init__(self) -> None:
        super().__post_init__()
        check_non_negative("loss.epsilon", self.epsilon)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CoNeConfig:
    """CoNe (cone.txt Eq. 13, Alg. 1); defaults are the CIFAR settings of Sec. 4."""

    name: Literal["cone"] = "cone"
    lambda_sup: float = 0.7
    lambda_dc: float = 0.4
    tau_sup: float = 0.1
    tau_dc: float = 0.07
    bank_size: int = 4096  # 65536 on ImageNet
    top_n: int = 32  # 512 on ImageNet
    label_smoothing: float = 0.0
    # Which embedding picks the top-N bank neighbours for L_in: the EMA key (no gradient
    # through the choice) or the query itself, as the authors' released code does.
    neighbours_from: Literal["key", "query"] = "query"
    ema_momentum: float = 0.996  # at step 0, cosine-increased to 1 (cone.txt Sec. 4)

    def __post_init__(self) -> None:
        check_non_negative("loss.lambda_sup", self.lambda_sup)
        check_non_negative("loss.lambda_dc", self.lambda_dc)
        check_positive("loss.tau_sup", self.tau_sup)
        check_positive("loss.tau_dc", self.tau_dc)
        check_at_least("loss.bank_size", self.bank_size, 1)
        check_at_least("loss.top_n", self.top_n, 1)
        check_in_range("loss.label_smoothing", self.label_smoothing, 0.0, 1.0)
        check_in_range("loss.ema_momentum", self.ema_momentum, 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class CEConfig:
    """Plain cross-entropy on the classifier head: the supervised baseline CoNe improves on."""

    name: Literal["ce"] = "ce"
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        check_in_range("loss.label_smoothing", self.label_smoothing, 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class CLIPConfig:
    """CLIP / LiT-style baseline: images vs their (frozen) caption embeddings via a head."""

    name: Literal["clip"] = "clip"
    tau: float = 0.07  # CLIP's initial temperature
    caption_dim: int = 384  # all-MiniLM-L6-v2

    def __post_init__(self) -> None:
        check_positive("loss.tau", self.tau)
        check_at_least("loss.caption_dim", self.caption_dim, 1)


LossConfig = Union[  # noqa: UP007 - a runtime Union keeps get_args() simple
    SimCLRConfig,
    SupConConfig,
    XCLRConfig,
    SINCEREConfig,
    EpsSupInfoNCEConfig,
    CoNeConfig,
    CEConfig,
    CLIPConfig,
]

# name -> config class; each class's ``name`` default is its tag.
LOSS_CONFIGS: dict[str, type] = {cls.name: cls for cls in get_args(LossConfig)}


@dataclasses.dataclass(frozen=True)
class LossSection:
    """A file (or part of one) whose only section is ``loss``; the run config grows later."""

    loss: LossConfig = dataclasses.field(default_factory=SimCLRConfig)

    tagged_unions: ClassVar[dict[str, dict[str, type]]] = {"loss": LOSS_CONFIGS}

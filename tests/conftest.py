"""Shared fixtures: deterministic seeds and the float64 default used by exactness tests."""

from __future__ import annotations

import os

import pytest
import torch

from tests.s3 import s3_endpoint, s3_uri  # noqa: F401

# The suite runs offline (make test uses a loopback-only namespace); make libraries agree.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)

"""Shared test setup.

Tests marked ``gpu`` need the compiled extension and a Hopper (sm_90) GPU; on
any other machine they are skipped with the reason flash_attn_hopper gives.
``FLASH_ATTN_HOPPER_FULL_TESTS=1`` turns the quick GPU subset into the full sweep.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
FULL_TESTS = os.environ.get("FLASH_ATTN_HOPPER_FULL_TESTS", "").strip().lower() in ("1", "true", "yes", "on")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs an NVIDIA Hopper (sm_90) GPU and the compiled extension; skipped otherwise"
    )


def pytest_collection_modifyitems(config, items):
    import flash_attn_hopper

    reason = flash_attn_hopper.unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test skipped: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT

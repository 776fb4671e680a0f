"""Shared test setup.

Tests marked ``gpu`` need the compiled extension and a Hopper (sm_90) GPU; on
any other machine they are skipped with the reason flash_attn_hopper gives.
``FLASH_ATTN_HOPPER_FULL_TESTS=1`` turns the quick GPU subset into the full sweep.

The session refuses to start when the tests would import a source tree without the compiled
extension while an installed package has it (helpers/location.py); the header names the copy tested.
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
    from helpers import location

    problem = location.shadowing_problem(location.imported_package_dir(), location.installed_extensions())
    if problem is not None:
        raise pytest.UsageError(problem)


def pytest_report_header(config):
    from helpers import location

    return location.describe(location.imported_package_dir(), location.installed_extensions())


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


@pytest.fixture(autouse=True)
def torch_sdpa_left_as_found():
    """Fail a test that leaves ``torch.nn.functional.scaled_dot_product_attention`` replaced.

    A leaked patch_sdpa() sends every later test's F.scaled_dot_product_attention call on that
    pytest worker through our drop-in instead of torch (and the registry tests then check our
    drop-in's strides against aten's promise: an order-dependent failure, seen on the H200).
    Autouse fixtures are torn down after a test's monkeypatch has been undone, so this sees the
    final state; it puts torch's function back before failing, so one leak fails one test.
    """
    import torch.nn.functional as F

    before = F.scaled_dot_product_attention
    yield
    after = F.scaled_dot_product_attention
    if after is not before:
        F.scaled_dot_product_attention = before
        pytest.fail(f"the test left torch.nn.functional.scaled_dot_product_attention replaced by {after!r}")

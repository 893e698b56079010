"""Shared paths for the data tests: hand-written fixtures here, real samples in ../shared/data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def fixtures() -> Path:
    """The hand-written fixtures in each source's original format."""
    return FIXTURES


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``<repo>/../shared/data`` with the real samples.

    In CI (CI set) a missing folder fails the test; elsewhere (a clone without the samples beside it) the tests
    that need them are skipped with the path they looked in.
    """
    if not SHARED_DATA.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"real data samples not found at {SHARED_DATA} (CI must provide ../shared/data)")
        pytest.skip(f"real data samples not found at {SHARED_DATA}")
    return SHARED_DATA

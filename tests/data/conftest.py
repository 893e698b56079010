"""Shared paths for the data tests: hand-written fixtures here, real samples in ../shared/data."""

from __future__ import annotations

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
    """``<repo>/../shared/data`` with the real samples; skips the test when it is not checked out."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data samples not found at {SHARED_DATA}")
    return SHARED_DATA

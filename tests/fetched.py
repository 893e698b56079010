"""The fetched real models the real-weight tests read: skipped outside CI naming the fetch command, failed in CI
(where `.ci/run` fetches them, so a missing one is a broken install, not a reason to skip)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from icml_jax.models import fetch


def fetched_dir(name: str) -> Path:
    """The cached directory of model `name` (`python -m icml_jax.models.fetch NAME`)."""
    directory = fetch.model_dir(name)
    if fetch.is_converted(directory, name):
        return directory
    reason = f"{name} is not fetched in {directory}; run `{fetch.fetch_command(name)}`"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)

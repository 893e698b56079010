"""Loading the repository's config files in tests, as `config_flags` does (by path, `--config=FILE:ARG`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ml_collections

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def load_config(name: str, *args: str) -> ml_collections.ConfigDict:
    """configs/<name>.py's get_config(*args)."""
    spec = importlib.util.spec_from_file_location(f"test_configs_{name}", CONFIGS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(*args)

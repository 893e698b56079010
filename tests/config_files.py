"""Loading the repository's config files in tests by name, through `icml_jax.configlib.load_config`."""

from __future__ import annotations

from pathlib import Path

import ml_collections

from icml_jax.configlib import load_config as load_config_file

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def load_config(name: str, arg: str | None = None) -> ml_collections.ConfigDict:
    """configs/<name>.py's get_config(arg), as `--config=configs/<name>.py:arg` gives it."""
    return load_config_file(f"{CONFIGS / name}.py" + (f":{arg}" if arg else ""))

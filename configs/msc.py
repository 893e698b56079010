"""Multi-Session Chat (ParlAI session 5): base.py defaults, Gemini back ends; set --config.model.path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    """The msc config (see configs/_dataset.py for what to set)."""
    spec = importlib.util.spec_from_file_location("icml_configs_dataset", Path(__file__).with_name("_dataset.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dataset_config("msc", "msc_episodes/parlai", "test")

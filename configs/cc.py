"""Conversation Chronicles: base.py defaults and Gemini back ends; set --config.model.path to a local checkpoint."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    """The cc config (see configs/_dataset.py for what to set)."""
    spec = importlib.util.spec_from_file_location("icml_configs_dataset", Path(__file__).with_name("_dataset.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dataset_config("cc", "cc_episodes/test", "test")

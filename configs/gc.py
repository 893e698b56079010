"""GapChat (the pooled 4- and 5-session test splits): base.py defaults, Gemini back ends; set --config.model.path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    """The gapchat config (see configs/_dataset.py for what to set)."""
    spec = importlib.util.spec_from_file_location("icml_configs_dataset", Path(__file__).with_name("_dataset.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # the protocol's pool of 100 test episodes, played once
    return module.dataset_config("gapchat", "gapchat_episodes/protocol", "test_4+test_5", train_episodes=100)

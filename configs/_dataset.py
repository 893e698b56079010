"""Shared by cc.py, msc.py and gc.py: base.py plus a real dataset, a local checkpoint and Gemini back ends."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import ml_collections


def _base() -> types.ModuleType:
    """configs/base.py loaded by path (config files are loaded as files, not as a package)."""
    spec = importlib.util.spec_from_file_location("icml_configs_base", Path(__file__).with_name("base.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dataset_config(name: str, tfds_name: str, split: str) -> ml_collections.ConfigDict:
    """base.py for one benchmark: set --config.model.path (a local HF checkpoint directory), --config.data.data_dir
    (built TFDS data) and GEMINI_API_KEY. Online learning on real datasets is not wired into the main job yet,
    so the default mode is synthesis + warm-up; adding 'online' is a config error that says so."""
    config = _base().get_config()
    config.mode = ("synthesize", "warmup")
    config.data.name = name
    config.data.tfds_name = tfds_name
    config.data.split = split
    # config.model.path stays a placeholder: a local checkpoint directory, e.g. /models/Llama-3.2-1B-Instruct
    return config

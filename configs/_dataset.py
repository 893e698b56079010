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


def dataset_config(name: str, tfds_name: str, split: str, train_episodes: int = 250) -> ml_collections.ConfigDict:
    """base.py for one benchmark: synthesize -> warm-up -> online learning on the dataset's episodes.

    Set before running:
      --config.model.path   a local Hugging Face checkpoint directory (config.json + *.safetensors)
      --config.data.data_dir  the TFDS data_dir holding the built `tfds_name` (python -m icml_jax.data.build_cli,
                            docs/data.md); checked up front, naming the field, before any stage runs
      GEMINI_API_KEY        (or GOOGLE_API_KEY) in the environment, for the generator and judge back ends

    Which episodes: online learning on a benchmark is test-time learning, as the evaluation protocol has it
    (shared/docs/datasets.md): the agent plays the test episodes, acting at every turn of every session
    (both speakers: `icml_jax.data.stream.user_speaker` is None) and learning as it goes, and is scored on
    the final sessions. So `split` is the protocol's test split (GapChat: its pooled 4- and 5-session test
    files, "test_4+test_5"); MSC has no 5-session train split at all. The stream shuffles the split with
    `config.seed` and plays `config.data.train_episodes` episodes per process, repeating the split (each
    epoch in a new order) if it is smaller. To learn on episodes disjoint from the test set instead, build
    the `full` configs and set e.g. --config.data.tfds_name=cc_episodes/full --config.data.split=train.
    Real data has no y_p / y_t labels, so there is no held-out label evaluation (`eval_episodes` is unused).
    """
    config = _base().get_config()
    config.mode = ("synthesize", "warmup", "online")
    config.data.name = name
    config.data.tfds_name = tfds_name
    config.data.split = split
    config.data.train_episodes = train_episodes
    # config.model.path stays a placeholder: a local checkpoint directory, e.g. /models/Llama-3.2-1B-Instruct
    return config

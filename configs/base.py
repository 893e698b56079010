"""Base config (paper defaults). This file holds only the model / policy / LoRA / parallel blocks for now; the defaults
live in code (`icml_jax.models.lora.default_config`, `icml_jax.parallel.default_config`) so they stay importable.
"""

from __future__ import annotations

import ml_collections
from ml_collections.config_dict import placeholder

from icml_jax import parallel
from icml_jax.agents import build as policy_build
from icml_jax.models import lora


def get_config() -> ml_collections.ConfigDict:
    """The config tree; override fields with --config.<path>=value."""
    config = ml_collections.ConfigDict()
    config.model = ml_collections.ConfigDict(dict(
        path=placeholder(str),  # local Hugging Face directory (config.json + safetensors); nothing is downloaded
        dtype="bfloat16",
    ))
    config.policy = policy_build.default_config()
    config.policy.planner_model = config.model.get_ref("path")  # the Planner's backbone is the model by default
    config.policy.dtype = config.model.get_ref("dtype")
    config.lora = lora.default_config()
    config.parallel = parallel.default_config()
    return config

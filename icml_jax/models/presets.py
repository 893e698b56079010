"""The paper's backbone sizes as HF-style config dicts (each family module holds its own), so presets and real
checkpoints share one code path."""

from __future__ import annotations

from icml_jax.models.config import ModelConfig
from icml_jax.models.families import PRESETS

__all__ = ["PRESETS", "preset"]


def preset(name: str) -> ModelConfig:
    """ModelConfig of a named paper backbone (for abstract shapes, sharding plans and benchmarks)."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; available: {sorted(PRESETS)}")
    return ModelConfig.from_hf(PRESETS[name])

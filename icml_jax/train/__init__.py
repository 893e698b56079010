"""Training outside the online loop: the supervised warm-up on synthesized expert data, and its policy file
(re-exported from `icml_jax.checkpoint`)."""

from icml_jax.checkpoint import load_warmup, read_warmup_metadata, save_warmup
from icml_jax.train.supervised import (
    WarmupConfig,
    WarmupResult,
    default_config,
    encode_data,
    evaluate,
    warmup,
)

__all__ = [
    "WarmupConfig",
    "WarmupResult",
    "default_config",
    "encode_data",
    "evaluate",
    "load_warmup",
    "read_warmup_metadata",
    "save_warmup",
    "warmup",
]

"""The warm-up's policy file under its former import path, for `icml_jax.validation` and `icml_jax.evaluate`
(to be dropped once they import `icml_jax.checkpoint`); everything lives in `icml_jax.checkpoint.policy_file`."""

from icml_jax.checkpoint.policy_file import META_FILE, STATE_DIR, load_warmup, read_warmup_metadata, save_warmup

__all__ = ["META_FILE", "STATE_DIR", "load_warmup", "read_warmup_metadata", "save_warmup"]

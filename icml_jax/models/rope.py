"""Rotary embeddings: one layer kind's settings (`RopeConfig`), and their reading from a HF config's rope dict."""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from icml_jax.models.config_keys import ConfigKeys, ModelConfigError


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of one layer kind: base frequency plus optional `linear` or `llama3` scaling."""

    theta: float
    kind: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        """Rejects a base or scale that is not finite and positive (ModelConfigError), before any power or log."""
        for name in ("theta", "factor", "low_freq_factor", "high_freq_factor"):
            value = getattr(self, name)
            if not (isinstance(value, numbers.Real) and math.isfinite(value) and value > 0):
                raise ModelConfigError(f"rope {name} = {value!r} must be a finite positive number")

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """Inverse frequencies [head_dim // 2] in float32, computed the way `transformers` does."""
        exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
        inv = (np.float32(1.0) / (np.float32(self.theta) ** exponent)).astype(np.float32)
        if self.kind == "default":
            return inv
        if self.kind == "linear":
            return (inv / np.float32(self.factor)).astype(np.float32)
        if self.kind == "llama3":
            low_wavelen = self.original_max_position_embeddings / self.low_freq_factor
            high_wavelen = self.original_max_position_embeddings / self.high_freq_factor
            wavelen = 2 * math.pi / inv
            scaled = np.where(wavelen > low_wavelen, inv / self.factor, inv)
            smooth = (self.original_max_position_embeddings / wavelen - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor
            )
            smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
            medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
            return np.where(medium, smoothed, scaled).astype(np.float32)
        raise ValueError(f"unsupported rope scaling type {self.kind!r} (supported: default, linear, llama3)")


def rope_from_hf(params: ConfigKeys | None, default_theta: float) -> RopeConfig:
    """Reads the `rope_parameters` (transformers 5) or `rope_scaling` (older files) dict, checking its numbers."""
    if params is None:
        return RopeConfig(theta=default_theta)
    get = params.hf.get
    kind = get("rope_type") or get("type") or "default"
    theta = params.pos_float("rope_theta", default_theta)
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind == "linear":
        return RopeConfig(theta=theta, kind="linear", factor=params.pos_float("factor"))
    if kind == "llama3":
        low, high = params.pos_float("low_freq_factor"), params.pos_float("high_freq_factor")
        if high <= low:
            raise params.error("high_freq_factor", high, f"must exceed low_freq_factor = {low}")
        return RopeConfig(
            theta=theta,
            kind="llama3",
            factor=params.pos_float("factor"),
            low_freq_factor=low,
            high_freq_factor=high,
            original_max_position_embeddings=params.pos_int("original_max_position_embeddings"),
        )
    raise params.error("rope_type", kind, "is not supported (default, linear, llama3)")

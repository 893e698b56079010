"""Shared test setup: float32 matmuls at full precision so parity checks test the math, not the back end."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

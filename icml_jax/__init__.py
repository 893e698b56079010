"""icml_jax: Interactive Memory Learning for long-term conversations, in JAX/Flax NNX."""

__version__ = "0.1.0"

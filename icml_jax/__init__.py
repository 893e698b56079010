"""icml_jax: Interactive Memory Learning for long-term conversations, in JAX/Flax NNX."""

from icml_jax import cpu_rng

cpu_rng.register()  # before anything compiles: every jax.random draw on CPU without a loop

__version__ = "0.1.0"

"""`python -m icml_jax.experiments`: see `icml_jax.experiments.runner`."""

from icml_jax.experiments.runner import cli

if __name__ == "__main__":
    cli()

"""The run's stages, one module each: `synthesize` (expert data), `warmup` (supervised cold start), `online`
(PPO with held-out evaluations); `run` holds what they share. `icml_jax.run.pipeline.run` runs them in `STAGES`
order."""

STAGES = ("synthesize", "warmup", "online")

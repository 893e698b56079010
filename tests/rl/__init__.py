"""Tests of icml_jax.rl: rewards, the Pending Reward Buffer, GAE, PPO losses and the optimizer factory."""

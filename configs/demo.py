"""The offline demo: persona world, tiny random backbone with a locally built tokenizer, offline back ends;
synthesis -> warm-up -> online PPO in about 25 s on 2 CPU cores, no weights, data or network.

    python -m icml_jax.main --config=configs/demo.py --workdir=/tmp/icml_demo

Sizes and learning rates follow the persona-world learning experiment (`icml_jax.rl.persona_run`), whose
docstring explains the departures from the paper's values (tiny backbone, heads only, lr 1e-2, gamma 0).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import types
from pathlib import Path

import ml_collections

from icml_jax.rl import persona_run


def _base() -> types.ModuleType:
    """configs/base.py loaded by path (config files are loaded as files, not as a package)."""
    spec = importlib.util.spec_from_file_location("icml_configs_base", Path(__file__).with_name("base.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config() -> ml_collections.ConfigDict:
    """base.py with the demo's world, model, back ends and sizes."""
    config = _base().get_config()
    experiment = persona_run.PersonaRunConfig()
    config.data.name = "persona_world"
    world = dataclasses.asdict(persona_run.learning_world())
    for key, value in world.items():
        config.data.world[key] = list(value) if isinstance(value, tuple) else value
    config.data.train_episodes = 60
    config.data.eval_episodes = 8
    config.model.kind = "tiny"
    config.model.hidden = experiment.hidden
    config.model.layers = experiment.layers
    config.model.dtype = "float32"
    config.policy.pooling = experiment.pooling
    config.policy.match_rank = experiment.match_rank
    config.llm.generator = ml_collections.ConfigDict(dict(kind="offline"))
    config.llm.judge = ml_collections.ConfigDict(dict(kind="offline"))
    for key, value in dataclasses.asdict(persona_run.learning_observation()).items():
        config.observation[key] = value
    # a small expert set from the same world: 12 seeds x 2 storylines x 3 prequels
    config.synthesis.num_seeds = 12
    config.synthesis.storylines_per_seed = 2
    config.synthesis.prequels_per_storyline = 3
    config.synthesis.heldout_fraction = 0.25
    config.synthesis.hard_negatives = 1
    config.synthesis.soft_negatives = 1
    for key in ("fact_kinds", "min_user_turns", "noise_ratio"):
        config.synthesis.world[key] = config.data.world[key]
    config.warmup.learning_rate = 3e-3
    config.warmup.epochs = 1
    config.warmup.batch_size = 8
    config.warmup.log_every = 10
    for key, value in experiment.ppo.to_dict().items():
        config.rl.ppo[key] = value
    config.rl.reward.save_cost = experiment.reward.save_cost
    return config

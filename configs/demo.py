"""The offline demo: persona world, tiny random backbone with a locally built tokenizer, offline back ends;
synthesis -> warm-up -> online PPO in about 25 s on 2 CPU cores, no weights, data or network.

    python -m icml_jax.main --config=configs/demo.py --workdir=/tmp/icml_demo

World, observation sizes, the tiny model and the PPO and reward settings come from `icml_jax.agents.tiny`, which
the persona-world experiment shares (`icml_jax.experiments.persona_run.PersonaRunConfig`, whose docstring explains
the departures from the paper: tiny backbone, heads only, lr 1e-2, gamma 0).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import types
from pathlib import Path

import ml_collections

from icml_jax.agents import tiny


def _base() -> types.ModuleType:
    """configs/base.py loaded by path (config files are loaded as files, not as a package)."""
    spec = importlib.util.spec_from_file_location("icml_configs_base", Path(__file__).with_name("base.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config() -> ml_collections.ConfigDict:
    """base.py with the demo's world, model, back ends and sizes."""
    base = _base()
    config = base.get_config()
    config.data.name = "persona_world"
    world = dataclasses.asdict(tiny.learning_world())
    for key, value in world.items():
        config.data.world[key] = list(value) if isinstance(value, tuple) else value
    config.data.train_episodes = 60
    config.data.eval_episodes = 8
    config.model.kind = "tiny"
    config.model.hidden = 64
    config.model.layers = 1
    config.model.dtype = "float32"
    config.policy.pooling = "mean"
    config.policy.match_rank = 16
    # offline back ends (the judge an oracle: it reads the world's labels); switchable to a served model with
    # --config.llm.<role>.kind=openai and its base_url, model and api_key_env
    config.llm.generator = base.backend_block("offline")
    config.llm.judge = base.backend_block("offline")
    config.llm.synthesizer = base.backend_block("offline")  # the world's templates, whatever writes the replies
    for key, value in dataclasses.asdict(tiny.learning_observation()).items():
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
    for key, value in tiny.LEARNING_PPO.items():
        config.rl.ppo[key] = value
    config.rl.reward.save_cost = tiny.LEARNING_SAVE_COST
    return config

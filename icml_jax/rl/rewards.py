"""Per-decision rewards of the Trigger and the Planner as pure elementwise functions of judge scores.

Each function runs in NumPy when every input is a NumPy array or Python number (the per-turn Python loop and the
Pending Reward Buffer: no device dispatch, no compilation per batch size) and in jax.numpy when any input is a
jax array or tracer (inside jit). Both give float32 results from the same formula.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from icml_jax.rl.config import RewardConfig


def _xp(*xs: Any) -> ModuleType:
    """jax.numpy if any input is a jax array (or tracer), else numpy."""
    return jnp if any(isinstance(x, jax.Array) for x in xs) else np


def trigger_reward(r_qual: Any) -> Any:
    """Trigger reward: the judged quality r_qual in [0, 1] of the reply written with the chosen memory."""
    return _xp(r_qual).asarray(r_qual, dtype=np.float32)


def save_reward(r_proxy: Any, config: RewardConfig) -> Any:
    """Base reward of a save: r_proxy minus the optional per-fragment cost (before any truth bonus)."""
    xp = _xp(r_proxy)
    return xp.asarray(r_proxy, dtype=np.float32) - np.float32(config.save_cost)


def miss_penalty(r_proxy: Any, config: RewardConfig) -> Any:
    """Reward of a discard: -alpha * r_proxy when the turn was high-value (r_proxy >= threshold), else 0."""
    xp = _xp(r_proxy)
    r = xp.asarray(r_proxy, dtype=np.float32)
    return xp.where(r >= config.high_value_threshold, -np.float32(config.alpha) * r, np.float32(0.0))


def planner_reward(saved: Any, r_proxy: Any, config: RewardConfig) -> Any:
    """Immediate Planner reward: `save_reward` for saves, `miss_penalty` for discards (elementwise)."""
    xp = _xp(saved, r_proxy)
    r = xp.asarray(r_proxy, dtype=np.float32)
    return xp.where(xp.asarray(saved, dtype=bool), save_reward(r, config), miss_penalty(r, config))


def truth_reward(r_proxy: Any, r_qual_future: Any, triggered: Any, config: RewardConfig) -> Any:
    """Cross-session truth reward of a save: save_reward + lambda * r_qual(future) * 1[triggered]."""
    xp = _xp(r_proxy, r_qual_future, triggered)
    r = xp.asarray(r_proxy, dtype=np.float32)
    bonus = np.float32(config.truth_lambda) * xp.asarray(r_qual_future, dtype=np.float32)
    # where, not multiply: an untriggered save may carry a NaN placeholder for r_qual_future.
    return save_reward(r, config) + xp.where(xp.asarray(triggered, dtype=bool), bonus, np.float32(0.0))


def planner_reward_bounds(config: RewardConfig) -> tuple[float, float]:
    """(lowest, highest) Planner reward for judge scores in [0, 1]: a save spans [-save_cost, 1 - save_cost +
    truth_lambda], a discard [-alpha, 0] (0 alone when no score reaches the high-value threshold)."""
    miss = config.alpha if config.high_value_threshold <= 1.0 else 0.0
    low = min(-miss, -config.save_cost, 0.0)
    high = max(1.0 - config.save_cost + config.truth_lambda, 0.0)
    return float(low), float(high)


def normalize_planner_reward(reward: Any, config: RewardConfig) -> Any:
    """The Planner reward mapped affinely from `planner_reward_bounds` onto [0, 1] (the paper's reward scale)."""
    xp = _xp(reward)
    low, high = planner_reward_bounds(config)
    return (xp.asarray(reward, dtype=np.float32) - np.float32(low)) / np.float32(high - low)


def planner_training_reward(reward: Any, config: RewardConfig) -> Any:
    """What advantages are computed from: `normalize_planner_reward` when `config.normalize`, else the raw reward."""
    if config.normalize:
        return normalize_planner_reward(reward, config)
    return _xp(reward).asarray(reward, dtype=np.float32)

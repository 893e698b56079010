"""Reward functions against plain NumPy formulas, in NumPy and under jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from icml_jax.rl import RewardConfig, miss_penalty, planner_reward, save_reward, trigger_reward, truth_reward


def np_planner(saved, r_proxy, alpha, thr, cost):
    out = np.zeros_like(r_proxy)
    for i, (s, r) in enumerate(zip(saved, r_proxy)):
        if s:
            out[i] = r - cost
        elif r >= thr:
            out[i] = -alpha * r
    return out


def test_planner_reward_matches_reference():
    cfg = RewardConfig(alpha=2.0, high_value_threshold=0.6, save_cost=0.05)
    rng = np.random.default_rng(0)
    r = rng.uniform(size=50).astype(np.float32)
    r[:3] = [0.6, 0.59999, 1.0]  # threshold is inclusive
    saved = rng.uniform(size=50) < 0.5
    saved[:3] = False
    want = np_planner(saved, r, 2.0, 0.6, 0.05)
    np.testing.assert_allclose(planner_reward(saved, r, cfg), want, rtol=1e-6)
    assert planner_reward(False, 0.6, cfg) == pytest.approx(-1.2)
    assert planner_reward(False, 0.59, cfg) == 0.0
    assert planner_reward(True, 0.2, cfg) == pytest.approx(0.15)
    got = jax.jit(lambda s, x: planner_reward(s, x, cfg))(jnp.asarray(saved), jnp.asarray(r))
    assert isinstance(got, jax.Array)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_miss_penalty_and_save_reward():
    cfg = RewardConfig(alpha=0.5, high_value_threshold=0.7)
    np.testing.assert_allclose(miss_penalty(np.array([0.1, 0.7, 0.9]), cfg), [0.0, -0.35, -0.45], rtol=1e-6)
    np.testing.assert_allclose(save_reward(np.array([0.1, 0.9]), cfg), [0.1, 0.9], rtol=1e-6)
    np.testing.assert_allclose(trigger_reward([0.3, 1.0]), [0.3, 1.0])


def test_truth_reward_formula_and_nan_placeholder():
    cfg = RewardConfig(truth_lambda=0.5, save_cost=0.1)
    r_proxy = np.array([0.4, 0.4, 0.8], np.float32)
    qual = np.array([1.0, np.nan, 0.2], np.float32)  # NaN = never triggered
    triggered = np.array([True, False, True])
    want = r_proxy - 0.1 + 0.5 * np.where(triggered, np.nan_to_num(qual), 0.0)
    np.testing.assert_allclose(truth_reward(r_proxy, qual, triggered, cfg), want, rtol=1e-6)
    jitted = jax.jit(lambda a, b, c: truth_reward(a, b, c, cfg))(*map(jnp.asarray, (r_proxy, qual, triggered)))
    np.testing.assert_allclose(jitted, want, rtol=1e-6)

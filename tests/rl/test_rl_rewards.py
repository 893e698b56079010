"""Reward functions against plain NumPy formulas, in NumPy and under jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from icml_jax.rl import (
    RewardConfig,
    miss_penalty,
    normalize_planner_reward,
    planner_reward,
    planner_reward_bounds,
    planner_training_reward,
    save_reward,
    trigger_reward,
    truth_reward,
)


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


def np_planner_rewards_over_grid(alpha, thr, cost, lam, n=21):
    """Every Planner reward the formulas give on a grid of judge scores: saves (triggered or not) and discards."""
    grid = np.linspace(0.0, 1.0, n)
    out = []
    for r_proxy in grid:
        out.append(-alpha * r_proxy if r_proxy >= thr else 0.0)  # discard
        out.append(r_proxy - cost)  # untriggered save
        out += [r_proxy - cost + lam * q for q in grid]  # triggered save
    return np.array(out)


@pytest.mark.parametrize("alpha,thr,cost,lam", [(1.0, 0.5, 0.0, 0.5), (2.0, 0.6, 0.3, 0.5), (0.0, 0.5, 0.0, 0.0),
                                                (0.5, 1.5, 2.5, 0.5), (1.0, 0.5, 0.5, 1.0)])
def test_planner_reward_bounds_are_the_extremes_and_normalisation_maps_them_onto_0_1(alpha, thr, cost, lam):
    cfg = RewardConfig(alpha=alpha, high_value_threshold=thr, save_cost=cost, truth_lambda=lam)
    everything = np_planner_rewards_over_grid(alpha, thr, cost, lam)
    assert planner_reward_bounds(cfg) == pytest.approx((everything.min(), everything.max()))
    want = (everything - everything.min()) / (everything.max() - everything.min())
    got = normalize_planner_reward(everything.astype(np.float32), cfg)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got.min() == pytest.approx(0.0, abs=1e-6) and got.max() == pytest.approx(1.0, abs=1e-6)
    jitted = jax.jit(lambda r: normalize_planner_reward(r, cfg))(jnp.asarray(everything, jnp.float32))
    np.testing.assert_allclose(jitted, want, rtol=1e-5, atol=1e-6)


def test_training_reward_is_normalised_by_default_and_raw_on_request():
    raw = np.array([-1.0, 0.0, 0.4, 1.5], np.float32)
    paper = RewardConfig()  # alpha 1, lambda 0.5, no save cost: [-1, 1.5] -> [0, 1]
    assert paper.normalize
    np.testing.assert_allclose(planner_training_reward(raw, paper), (raw + 1.0) / 2.5, rtol=1e-6)
    np.testing.assert_array_equal(planner_training_reward(raw, RewardConfig(normalize=False)), raw)
    with pytest.raises(ValueError, match="RewardConfig.normalize"):
        RewardConfig(normalize="yes")

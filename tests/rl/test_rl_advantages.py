"""GAE, discounted returns and whitening against plain NumPy loops; padding never leaks into real steps."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from icml_jax.rl import PPOConfig, compute_advantages, discounted_returns, gae, whiten

B, T = 3, 8


def np_gae(rewards, values, dones, mask, bootstrap, gamma, lam):
    """Textbook GAE per row over the real steps only (padding removed), written as a plain loop."""
    rewards, values = np.atleast_2d(rewards), np.atleast_2d(values)
    dones, mask = np.atleast_2d(dones).astype(bool), np.atleast_2d(mask).astype(bool)
    bootstrap = np.broadcast_to(bootstrap, rewards.shape[:1])
    adv = np.zeros(rewards.shape, np.float64)
    for b in range(rewards.shape[0]):
        next_value, next_adv = float(bootstrap[b]), 0.0
        for t in reversed(range(rewards.shape[1])):
            if not mask[b, t]:
                continue
            nonterminal = 0.0 if dones[b, t] else 1.0
            delta = rewards[b, t] + gamma * next_value * nonterminal - values[b, t]
            next_adv = delta + gamma * lam * nonterminal * next_adv
            next_value = values[b, t]
            adv[b, t] = next_adv
    ret = np.where(mask, adv + values, 0.0)
    return adv, ret


def np_returns(rewards, dones, mask, bootstrap, gamma):
    rewards = np.atleast_2d(rewards)
    dones, mask = np.atleast_2d(dones).astype(bool), np.atleast_2d(mask).astype(bool)
    bootstrap = np.broadcast_to(bootstrap, rewards.shape[:1])
    out = np.zeros(rewards.shape, np.float64)
    for b in range(rewards.shape[0]):
        g = float(bootstrap[b])
        for t in reversed(range(rewards.shape[1])):
            if mask[b, t]:
                g = rewards[b, t] + gamma * (0.0 if dones[b, t] else g)
                out[b, t] = g
    return out


def random_batch(seed, shape=(B, T)):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=shape).astype(np.float32)
    values = rng.normal(size=shape).astype(np.float32)
    dones = rng.uniform(size=shape) < 0.2
    lengths = rng.integers(1, shape[-1] + 1, size=shape[:-1])
    mask = np.arange(shape[-1]) < lengths[..., None]  # right padding
    boot = rng.normal(size=shape[:-1]).astype(np.float32)
    return rewards, values, dones, mask, boot


def test_gae_batch_matches_numpy_reference():
    rewards, values, dones, mask, boot = random_batch(0)
    adv, ret = gae(rewards, values, dones, mask, boot, 0.99, 0.95)
    want_adv, want_ret = np_gae(rewards, values, dones, mask, boot, 0.99, 0.95)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)


def test_gae_single_episode_matches_closed_form():
    """Without dones or padding, A_t = sum_l (gamma*lam)^l delta_{t+l}; lam=1 gives G - V; lam=0 gives delta."""
    rng = np.random.default_rng(1)
    r, v = rng.normal(size=T).astype(np.float32), rng.normal(size=T).astype(np.float32)
    gamma, lam, boot = 0.9, 0.8, 0.5
    v_next = np.append(v[1:], boot)
    delta = r + gamma * v_next - v
    want = np.array([sum((gamma * lam) ** l * delta[t + l] for l in range(T - t)) for t in range(T)])
    adv, ret = gae(r, v, None, None, boot, gamma, lam)
    assert adv.shape == (T,)
    np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want + v, rtol=1e-5, atol=1e-5)
    g = discounted_returns(r, None, None, boot, gamma)
    np.testing.assert_allclose(gae(r, v, None, None, boot, gamma, 1.0)[0], g - v, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gae(r, v, None, None, boot, gamma, 0.0)[0], delta, rtol=1e-5, atol=1e-5)


def test_discounted_returns_match_numpy_reference():
    rewards, _, dones, mask, boot = random_batch(2)
    got = discounted_returns(rewards, dones, mask, boot, 0.99)
    np.testing.assert_allclose(got, np_returns(rewards, dones, mask, boot, 0.99), rtol=1e-5, atol=1e-5)


def test_done_stops_bootstrapping():
    r = np.array([0.0, 0.0, 1.0, 0.0, 0.0, 2.0], np.float32)
    dones = np.array([0, 0, 1, 0, 0, 1], bool)
    g = discounted_returns(r, dones, None, 100.0, 0.5)
    np.testing.assert_allclose(g, [0.25, 0.5, 1.0, 0.5, 1.0, 2.0])  # bootstrap 100 is never used


def test_padding_never_leaks_into_real_steps():
    """Garbage (NaN, inf, huge) in padded steps, at the end or in between, changes nothing real."""
    rewards, values, dones, _, boot = random_batch(3)
    mask = np.ones((B, T), bool)
    mask[0, 5:] = False  # right padding
    mask[1, [1, 4]] = False  # holes: skipped by the recursion
    clean_adv, clean_ret = gae(rewards, values, dones, mask, boot, 0.99, 0.95)
    r2, v2, d2 = rewards.copy(), values.copy(), dones.copy()
    r2[~mask], d2[~mask] = np.nan, True
    v2[~mask] = np.array([np.inf, -np.inf, 1e30, np.nan])[np.arange((~mask).sum()) % 4]
    adv, ret = gae(r2, v2, d2, mask, boot, 0.99, 0.95)
    np.testing.assert_array_equal(adv, clean_adv)
    np.testing.assert_array_equal(ret, clean_ret)
    assert np.all(np.asarray(adv)[~mask] == 0) and np.all(np.asarray(ret)[~mask] == 0)
    # a row with holes equals the same row with the holes removed
    real = mask[1]
    compact_adv, _ = gae(rewards[1, real], values[1, real], dones[1, real], None, boot[1], 0.99, 0.95)
    np.testing.assert_allclose(np.asarray(adv)[1, real], compact_adv, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(
        discounted_returns(r2, d2, mask, boot, 0.99), discounted_returns(rewards, dones, mask, boot, 0.99)
    )


def test_whiten_uses_real_entries_only():
    x = np.array([[1.0, 2.0, 3.0, 1e6], [4.0, 5.0, np.nan, np.nan]], np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
    real = x[mask]
    want = np.zeros_like(x)
    want[mask] = (real - real.mean()) / (real.std() + 1e-8)
    got = whiten(x, mask)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.asarray(got)[mask].mean() == pytest.approx(0.0, abs=1e-6)


def test_compute_advantages_follows_config():
    rewards, values, dones, mask, boot = random_batch(4)
    adv, ret = compute_advantages(rewards, values, dones, mask, boot, PPOConfig(whiten=True, gamma=0.9))
    raw, want_ret = np_gae(rewards, values, dones, mask, boot, 0.9, 0.95)
    want = np.where(mask, (raw - raw[mask].mean()) / (raw[mask].std() + 1e-8), 0.0)
    np.testing.assert_allclose(adv, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)  # returns are never whitened
    adv_raw, _ = compute_advantages(rewards, values, dones, mask, boot, PPOConfig(whiten=False, gamma=0.9))
    np.testing.assert_allclose(adv_raw, raw, rtol=1e-5, atol=1e-5)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="values shape"):
        gae(np.zeros((2, 4)), np.zeros((2, 5)))


FLOATS = st.floats(-10, 10, allow_nan=False, width=32)


@settings(max_examples=40, deadline=None)
@given(
    rewards=hnp.arrays(np.float32, (B, T), elements=FLOATS),
    values=hnp.arrays(np.float32, (B, T), elements=FLOATS),
    dones=hnp.arrays(bool, (B, T)),
    mask=hnp.arrays(bool, (B, T)),
    boot=hnp.arrays(np.float32, (B,), elements=FLOATS),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
)
def test_gae_property_matches_reference(rewards, values, dones, mask, boot, gamma, lam):
    adv, ret = gae(rewards, values, dones, mask, boot, gamma, lam)
    want_adv, want_ret = np_gae(rewards, values, dones, mask, boot, gamma, lam)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-4, atol=1e-3)

"""Discounted returns and GAE over an agent's decisions: jitted, masked reverse `lax.scan`, optional whitening.

Arrays are [T] or [B, T] (time last). `dones[t] = 1` ends an episode after step t (nothing is bootstrapped
across it). `mask[t] = 0` marks padding: a padded step outputs 0 and is skipped by the recursion, so the next
real step (or `bootstrap_value` after the last one) is what a real step looks ahead to; whatever values,
rewards or dones a padded step holds (even NaN) never leak into real steps.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from icml_jax.rl.config import PPOConfig


def _time_major(x: ArrayLike, shape: tuple[int, ...], dtype: jnp.dtype) -> jnp.ndarray:
    """Broadcast to `shape` ([B, T]) and move time to the front ([T, B]) for the scan."""
    return jnp.swapaxes(jnp.broadcast_to(jnp.asarray(x, dtype=dtype), shape), 0, 1)


def _prepare(rewards, values, dones, mask, bootstrap_value):
    """Promote [T] inputs to [1, T], fill defaults, and return time-major float/bool arrays plus the batch shape."""
    rewards = jnp.asarray(rewards, dtype=jnp.float32)
    if rewards.ndim not in (1, 2):
        raise ValueError(f"advantages: rewards must be [T] or [B, T], got shape {rewards.shape}")
    squeeze = rewards.ndim == 1
    shape = (1,) + rewards.shape if squeeze else rewards.shape
    for name, arr in (("values", values), ("dones", dones), ("mask", mask)):
        if arr is not None and jnp.shape(arr) != rewards.shape:
            raise ValueError(f"advantages: {name} shape {jnp.shape(arr)} != rewards shape {rewards.shape}")
    r = _time_major(rewards, shape, jnp.float32)
    v = _time_major(0.0 if values is None else values, shape, jnp.float32)
    d = _time_major(False if dones is None else dones, shape, jnp.bool_)
    m = _time_major(True if mask is None else mask, shape, jnp.bool_)
    boot = jnp.broadcast_to(jnp.asarray(0.0 if bootstrap_value is None else bootstrap_value, jnp.float32), shape[:1])
    return r, v, d, m, boot, squeeze


def _finish(x: jnp.ndarray, squeeze: bool) -> jnp.ndarray:
    """Back to batch-major [B, T], or [T] when the input was 1-D."""
    x = jnp.swapaxes(x, 0, 1)
    return x[0] if squeeze else x


@jax.jit
def discounted_returns(
    rewards: ArrayLike,
    dones: ArrayLike | None = None,
    mask: ArrayLike | None = None,
    bootstrap_value: ArrayLike | None = None,
    gamma: ArrayLike = PPOConfig.gamma,
) -> jnp.ndarray:
    """Monte-Carlo returns G_t = r_t + gamma * (1 - done_t) * G_next over real (unmasked) steps; 0 on padding."""
    r, _, d, m, boot, squeeze = _prepare(rewards, None, dones, mask, bootstrap_value)
    gamma = jnp.asarray(gamma, jnp.float32)

    def step(next_return, xs):
        r_t, d_t, m_t = xs
        g = r_t + gamma * jnp.where(d_t, 0.0, next_return)
        return jnp.where(m_t, g, next_return), jnp.where(m_t, g, 0.0)

    _, out = jax.lax.scan(step, boot, (r, d, m), reverse=True)
    return _finish(out, squeeze)


@jax.jit
def gae(
    rewards: ArrayLike,
    values: ArrayLike,
    dones: ArrayLike | None = None,
    mask: ArrayLike | None = None,
    bootstrap_value: ArrayLike | None = None,
    gamma: ArrayLike = PPOConfig.gamma,
    gae_lambda: ArrayLike = PPOConfig.gae_lambda,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Generalised advantage estimation: (advantages, returns = advantages + values), both 0 on padding.

    delta_t = r_t + gamma * (1 - done_t) * V_next - V_t;  A_t = delta_t + gamma * lambda * (1 - done_t) * A_next.
    """
    r, v, d, m, boot, squeeze = _prepare(rewards, values, dones, mask, bootstrap_value)
    gamma = jnp.asarray(gamma, jnp.float32)
    lam = jnp.asarray(gae_lambda, jnp.float32)

    def step(carry, xs):
        next_value, next_adv = carry
        r_t, v_t, d_t, m_t = xs
        delta = r_t + gamma * jnp.where(d_t, 0.0, next_value) - v_t
        adv = delta + gamma * lam * jnp.where(d_t, 0.0, next_adv)
        carry = (jnp.where(m_t, v_t, next_value), jnp.where(m_t, adv, next_adv))
        return carry, (jnp.where(m_t, adv, 0.0), jnp.where(m_t, adv + v_t, 0.0))

    init = (boot, jnp.zeros_like(boot))
    _, (adv, ret) = jax.lax.scan(step, init, (r, v, d, m), reverse=True)
    return _finish(adv, squeeze), _finish(ret, squeeze)


@jax.jit
def whiten(x: ArrayLike, mask: ArrayLike | None = None, eps: float = 1e-8) -> jnp.ndarray:
    """(x - mean) / (std + eps) over the real entries of the whole batch; padded entries become 0."""
    x = jnp.asarray(x, jnp.float32)
    m = jnp.ones(x.shape, bool) if mask is None else jnp.broadcast_to(jnp.asarray(mask, bool), x.shape)
    n = jnp.maximum(jnp.sum(m), 1)
    xm = jnp.where(m, x, 0.0)
    mean = jnp.sum(xm) / n
    var = jnp.sum(jnp.where(m, jnp.square(x - mean), 0.0)) / n
    return jnp.where(m, (x - mean) / (jnp.sqrt(var) + eps), 0.0)


@functools.partial(jax.jit, static_argnames=("config",))
def compute_advantages(
    rewards: ArrayLike,
    values: ArrayLike,
    dones: ArrayLike | None,
    mask: ArrayLike | None,
    bootstrap_value: ArrayLike | None,
    config: PPOConfig,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """GAE with the config's gamma / lambda, advantages whitened when `config.whiten`; returns stay raw."""
    adv, ret = gae(rewards, values, dones, mask, bootstrap_value, config.gamma, config.gae_lambda)
    if config.whiten:
        adv = whiten(adv, mask)
    return adv, ret

"""PPO losses and diagnostics as pure functions of per-decision arrays (any shape, masked means).

Inputs are per decision: new / old log-probabilities of the taken action, advantages, returns, new / old
values, entropies of the policy at that decision, and a mask (1 = real decision, 0 = padding). Padded entries
may hold any value, even NaN or inf: they are replaced before any arithmetic, so neither the losses nor their
gradients see them. The joint update calls `ppo_loss` once per agent and adds the results with
`combine_agent_losses`.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from icml_jax.rl.config import PPOConfig

Metrics = dict[str, jnp.ndarray]


def _mask_like(mask: ArrayLike | None, like: jnp.ndarray) -> jnp.ndarray:
    """The boolean mask broadcast to `like`'s shape (all-real when None)."""
    if mask is None:
        return jnp.ones(like.shape, bool)
    return jnp.broadcast_to(jnp.asarray(mask, bool), like.shape)


def masked_mean(x: ArrayLike, mask: ArrayLike | None = None) -> jnp.ndarray:
    """Mean of `x` over real entries (0 when there are none); padded entries contribute neither value nor grad."""
    x = jnp.asarray(x)
    m = _mask_like(mask, x)
    return jnp.sum(jnp.where(m, x, 0.0)) / jnp.maximum(jnp.sum(m), 1).astype(x.dtype)


def log_ratio(new_logp: ArrayLike, old_logp: ArrayLike, mask: ArrayLike | None = None) -> jnp.ndarray:
    """log pi_new(a) - log pi_old(a), set to 0 on padding so exp() of it is finite there."""
    new_logp = jnp.asarray(new_logp, jnp.float32)
    m = _mask_like(mask, new_logp)
    return jnp.where(m, new_logp - jnp.where(m, jnp.asarray(old_logp, jnp.float32), 0.0), 0.0)


def policy_loss(
    new_logp: ArrayLike,
    old_logp: ArrayLike,
    advantages: ArrayLike,
    mask: ArrayLike | None = None,
    clip_eps: float = PPOConfig.clip_eps,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Clipped surrogate mean(-min(r * A, clip(r, 1 - eps, 1 + eps) * A)) and the importance ratio r."""
    lr = log_ratio(new_logp, old_logp, mask)
    m = _mask_like(mask, lr)
    ratio = jnp.exp(lr)
    adv = jnp.where(m, jax.lax.stop_gradient(jnp.asarray(advantages, jnp.float32)), 0.0)
    surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv)
    return masked_mean(-surrogate, m), ratio


def value_loss(
    values: ArrayLike,
    returns: ArrayLike,
    mask: ArrayLike | None = None,
    old_values: ArrayLike | None = None,
    value_clip: float | None = None,
) -> jnp.ndarray:
    """mean(0.5 * (V - R)^2); with `value_clip` c, mean(0.5 * max((V - R)^2, (V_old + clip(V - V_old, +-c) - R)^2))."""
    values = jnp.asarray(values, jnp.float32)
    m = _mask_like(mask, values)
    v = jnp.where(m, values, 0.0)
    ret = jnp.where(m, jax.lax.stop_gradient(jnp.asarray(returns, jnp.float32)), 0.0)
    err = jnp.square(v - ret)
    if value_clip is not None:
        if old_values is None:
            raise ValueError("value_loss: value_clip needs old_values")
        old = jnp.where(m, jax.lax.stop_gradient(jnp.asarray(old_values, jnp.float32)), 0.0)
        clipped = old + jnp.clip(v - old, -value_clip, value_clip)
        err = jnp.maximum(err, jnp.square(clipped - ret))
    return masked_mean(0.5 * err, m)


def entropy_bonus(entropies: ArrayLike, mask: ArrayLike | None = None) -> jnp.ndarray:
    """Mean policy entropy over real decisions (the loss subtracts entropy_coef times this)."""
    return masked_mean(jnp.asarray(entropies, jnp.float32), mask)


def approx_kl(new_logp: ArrayLike, old_logp: ArrayLike, mask: ArrayLike | None = None) -> jnp.ndarray:
    """Estimator of KL(old || new): mean((r - 1) - log r), >= 0 and exactly 0 when the policies agree."""
    lr = log_ratio(new_logp, old_logp, mask)
    return masked_mean(jnp.expm1(lr) - lr, mask)


def clip_fraction(ratio: ArrayLike, mask: ArrayLike | None = None, clip_eps: float = PPOConfig.clip_eps) -> jnp.ndarray:
    """Fraction of real decisions whose ratio left [1 - eps, 1 + eps]: how much of the batch was clipped."""
    ratio = jnp.asarray(ratio, jnp.float32)
    return masked_mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32), mask)


def ppo_loss(
    new_logp: ArrayLike,
    old_logp: ArrayLike,
    advantages: ArrayLike,
    returns: ArrayLike,
    values: ArrayLike,
    old_values: ArrayLike | None,
    entropies: ArrayLike,
    mask: ArrayLike | None,
    config: PPOConfig,
) -> tuple[jnp.ndarray, Metrics]:
    """One agent's PPO loss pg + value_coef * vf - entropy_coef * entropy, with its metrics (all scalars)."""
    pg, ratio = policy_loss(new_logp, old_logp, advantages, mask, config.clip_eps)
    vf = value_loss(values, returns, mask, old_values, config.value_clip)
    ent = entropy_bonus(entropies, mask)
    total = pg + config.value_coef * vf - config.entropy_coef * ent
    m = _mask_like(mask, ratio)
    metrics = {
        "loss": total,
        "policy_loss": pg,
        "value_loss": vf,
        "entropy": ent,
        "approx_kl": jax.lax.stop_gradient(approx_kl(new_logp, old_logp, m)),
        "clip_fraction": jax.lax.stop_gradient(clip_fraction(ratio, m, config.clip_eps)),
        "ratio_mean": jax.lax.stop_gradient(masked_mean(ratio, m)),
        "num_decisions": jnp.sum(m).astype(jnp.float32),
    }
    return total, metrics


def combine_agent_losses(per_agent: Mapping[str, tuple[jnp.ndarray, Metrics]]) -> tuple[jnp.ndarray, Metrics]:
    """Sum the agents' losses for the joint step; metrics are prefixed 'agent/name' plus the total 'loss'."""
    total = jnp.float32(0.0)
    metrics: Metrics = {}
    for agent, (loss, agent_metrics) in per_agent.items():
        total = total + loss
        metrics.update({f"{agent}/{k}": v for k, v in agent_metrics.items()})
    metrics["loss"] = total
    return total, metrics

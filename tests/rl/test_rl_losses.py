"""PPO losses against plain NumPy references; first-epoch identities; padding-safe values and gradients."""

import jax
import numpy as np
import pytest

from icml_jax.rl import (
    PPOConfig,
    approx_kl,
    clip_fraction,
    combine_agent_losses,
    policy_loss,
    ppo_loss,
    value_loss,
)

N = 16


def np_ppo(new, old, adv, ret, v, old_v, ent, mask, eps, value_coef, entropy_coef, value_clip=None):
    """Plain NumPy PPO on the real entries only."""
    m = mask.astype(bool)
    new, old, adv, ret, v, old_v, ent = (x[m].astype(np.float64) for x in (new, old, adv, ret, v, old_v, ent))
    ratio = np.exp(new - old)
    pg = np.mean(-np.minimum(ratio * adv, np.clip(ratio, 1 - eps, 1 + eps) * adv))
    err = (v - ret) ** 2
    if value_clip is not None:
        err = np.maximum(err, (old_v + np.clip(v - old_v, -value_clip, value_clip) - ret) ** 2)
    vf = np.mean(0.5 * err)
    entropy = np.mean(ent)
    kl = np.mean((ratio - 1) - np.log(ratio))
    clipfrac = np.mean(np.abs(ratio - 1) > eps)
    return {
        "loss": pg + value_coef * vf - entropy_coef * entropy,
        "policy_loss": pg,
        "value_loss": vf,
        "entropy": entropy,
        "approx_kl": kl,
        "clip_fraction": clipfrac,
    }


def batch(seed, spread=0.5):
    rng = np.random.default_rng(seed)
    old = np.log(rng.uniform(0.05, 1.0, N)).astype(np.float32)
    new = (old + rng.normal(0, spread, N)).astype(np.float32)
    f = lambda: rng.normal(size=N).astype(np.float32)  # noqa: E731
    mask = np.ones(N, bool)
    mask[-4:] = False
    return dict(
        new_logp=new, old_logp=old, advantages=f(), returns=f(), values=f(), old_values=f(),
        entropies=rng.uniform(0, 2, N).astype(np.float32), mask=mask,
    )


def np_args(b):
    return [b[k] for k in ("new_logp", "old_logp", "advantages", "returns", "values", "old_values", "entropies", "mask")]


jit_ppo = jax.jit(ppo_loss, static_argnames=("config",))


@pytest.mark.parametrize("value_clip", [None, 0.2])
def test_ppo_loss_matches_numpy_reference(value_clip):
    cfg = PPOConfig(value_clip=value_clip, value_coef=0.5, entropy_coef=0.01)
    b = batch(0)
    total, metrics = jit_ppo(**b, config=cfg)
    want = np_ppo(*np_args(b), cfg.clip_eps, cfg.value_coef, cfg.entropy_coef, value_clip)
    for key, value in want.items():
        assert float(metrics[key]) == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert float(total) == pytest.approx(want["loss"], rel=1e-5)
    assert 0 < float(metrics["clip_fraction"]) < 1  # the batch exercises both branches
    assert float(metrics["num_decisions"]) == N - 4


def test_value_clipping_bites():
    v, ret, old = np.array([2.0, 0.0]), np.array([0.0, 0.0]), np.array([0.0, 0.0])
    assert float(value_loss(v, ret)) == pytest.approx(0.5 * 4 / 2)
    # clipped candidate 0 + clip(2, +-0.5) = 0.5: max(4, 0.25) keeps the unclipped error here ...
    assert float(value_loss(v, ret, None, old, 0.5)) == pytest.approx(1.0)
    # ... while with the target far away the clipped (pessimistic) error wins: max((2-5)^2, (0.5-5)^2)
    assert float(value_loss(v, np.array([5.0, 0.0]), None, old, 0.5)) == pytest.approx(0.5 * 4.5**2 / 2)
    with pytest.raises(ValueError, match="old_values"):
        value_loss(v, ret, None, None, 0.5)


def test_first_epoch_ratio_is_one_and_nothing_is_clipped():
    """new == old log-probs (first PPO epoch, teacher-forced receipts): ratio 1, clip fraction 0, KL 0."""
    b = batch(1)
    b["new_logp"] = b["old_logp"].copy()
    cfg = PPOConfig()
    _, metrics = jit_ppo(**b, config=cfg)
    assert float(metrics["ratio_mean"]) == 1.0
    assert float(metrics["clip_fraction"]) == 0.0
    assert float(metrics["approx_kl"]) == 0.0
    m = b["mask"]
    assert float(metrics["policy_loss"]) == pytest.approx(-b["advantages"][m].mean(), rel=1e-6)
    _, ratio = policy_loss(b["new_logp"], b["old_logp"], b["advantages"], m, cfg.clip_eps)
    np.testing.assert_array_equal(ratio, np.ones(N))
    # the gradient of the surrogate at ratio 1 is the plain policy gradient -A / n
    grad = jax.grad(lambda lp: policy_loss(lp, b["old_logp"], b["advantages"], m, cfg.clip_eps)[0])(b["new_logp"])
    np.testing.assert_allclose(grad, np.where(m, -b["advantages"] / m.sum(), 0.0), rtol=1e-6)


def test_policy_gradient_matches_numpy_reference():
    b = batch(2, spread=0.3)
    eps, m, adv = 0.2, b["mask"], b["advantages"]
    grad = jax.grad(lambda lp: policy_loss(lp, b["old_logp"], adv, m, eps)[0])(b["new_logp"])
    ratio = np.exp(b["new_logp"].astype(np.float64) - b["old_logp"])
    clipped = ((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))  # min picks the flat branch
    want = np.where(m & ~clipped, -ratio * adv / m.sum(), 0.0)
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)


def test_padding_garbage_cannot_reach_loss_or_gradients():
    cfg = PPOConfig(value_clip=0.2)
    b = batch(3)
    clean_total, clean_metrics = jit_ppo(**b, config=cfg)
    dirty = {k: v.copy() for k, v in b.items()}
    pad = ~b["mask"]
    for k in ("new_logp", "old_logp", "advantages", "returns", "values", "old_values", "entropies"):
        dirty[k][pad] = np.array([np.nan, np.inf, -np.inf, 1e30], np.float32)
    total, metrics = jit_ppo(**dirty, config=cfg)
    assert float(total) == float(clean_total)
    for key in clean_metrics:
        assert float(metrics[key]) == float(clean_metrics[key]), key

    def loss(new_logp, values, entropies):
        return ppo_loss(new_logp, dirty["old_logp"], dirty["advantages"], dirty["returns"], values,
                        dirty["old_values"], entropies, dirty["mask"], cfg)[0]

    grads = jax.grad(loss, argnums=(0, 1, 2))(dirty["new_logp"], dirty["values"], dirty["entropies"])
    for g in grads:
        assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[pad] == 0)
    # advantages and returns are targets: no gradient flows into them
    g_adv = jax.grad(lambda a: policy_loss(b["new_logp"], b["old_logp"], a, b["mask"])[0])(b["advantages"])
    np.testing.assert_array_equal(g_adv, np.zeros(N))


def test_approx_kl_and_clip_fraction_reference():
    b = batch(4)
    m = b["mask"]
    ratio = np.exp(b["new_logp"] - b["old_logp"])
    want_kl = np.mean((ratio[m] - 1) - np.log(ratio[m]))
    assert float(approx_kl(b["new_logp"], b["old_logp"], m)) == pytest.approx(want_kl, rel=1e-5)
    assert float(clip_fraction(ratio, m, 0.2)) == pytest.approx(np.mean(np.abs(ratio[m] - 1) > 0.2))
    assert float(approx_kl(b["new_logp"], b["old_logp"], m)) >= 0


def test_all_padding_gives_zero_not_nan():
    b = batch(5)
    b["mask"] = np.zeros(N, bool)
    total, metrics = jit_ppo(**b, config=PPOConfig())
    assert float(total) == 0.0 and all(np.isfinite(float(v)) for v in metrics.values())


def test_combine_agent_losses_sums_and_prefixes():
    cfg = PPOConfig()
    p, t = batch(6), batch(7)
    per_agent = {"planner": ppo_loss(**p, config=cfg), "trigger": ppo_loss(**t, config=cfg)}
    total, metrics = combine_agent_losses(per_agent)
    assert float(total) == pytest.approx(float(per_agent["planner"][0]) + float(per_agent["trigger"][0]))
    assert "planner/clip_fraction" in metrics and "trigger/value_loss" in metrics and "loss" in metrics


"""Optimizer factory (learning rate per label, frozen weights, global-norm clipping) and the NaN guard."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from icml_jax.rl import (
    PPOConfig,
    all_finite,
    guarded_apply,
    label_params,
    make_optimizer,
    nnx_param_labels,
    skip_nonfinite,
)


def classify(path: str) -> str:
    if "value_head" in path:
        return "critic"
    if "lora" in path or "policy_head" in path:
        return "actor"
    return "frozen"


def toy_params():
    return {
        "backbone": {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)},
        "lora": {"a": jnp.zeros(4)},
        "policy_head": {"w": jnp.zeros(3)},
        "value_head": {"w": jnp.zeros(2)},
    }


def test_label_params_by_path():
    labels = label_params(toy_params(), classify)
    assert labels == {
        "backbone": {"w": "frozen", "b": "frozen"},
        "lora": {"a": "actor"},
        "policy_head": {"w": "actor"},
        "value_head": {"w": "critic"},
    }
    with pytest.raises(ValueError, match="backbone/"):
        label_params(toy_params(), lambda p: "oops")


def test_each_label_gets_its_learning_rate_and_frozen_never_moves():
    params = toy_params()
    tx = make_optimizer(PPOConfig(), label_params(params, classify))
    opt_state = tx.init(params)
    rng = np.random.default_rng(0)
    grads = jax.tree.map(lambda p: jnp.asarray(rng.choice([-1.0, 1.0], p.shape) * 1e-3, jnp.float32), params)
    updates, _ = tx.update(grads, opt_state, params)
    new = optax.apply_updates(params, updates)
    # first Adam step moves every trainable weight by lr * sign(grad) (bias-corrected m / sqrt(v) = sign)
    for group, lr in (("lora", 1e-6), ("policy_head", 1e-6), ("value_head", 1e-5)):
        for k in new[group]:
            np.testing.assert_allclose(new[group][k], -lr * np.sign(grads[group][k]), rtol=1e-4)
    for k in new["backbone"]:
        np.testing.assert_array_equal(new["backbone"][k], params["backbone"][k])
    # frozen weights carry no Adam moments: state size = 2 moments x trainable leaves only
    moment_elems = sum(x.size for x in jax.tree.leaves(opt_state) if x.ndim > 0)
    assert moment_elems == 2 * (4 + 3 + 2)


def np_adam(grads_seq, lr, b1=0.9, b2=0.999, eps=1e-8):
    m = v = np.zeros_like(grads_seq[0])
    x = np.zeros_like(grads_seq[0])
    for t, g in enumerate(grads_seq, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        x = x - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return x


def test_global_norm_clipping_against_numpy_reference():
    """Two steps: a huge gradient (clipped) then a small one (not); huge frozen grads must not shrink either."""
    cfg = PPOConfig(max_grad_norm=1.0, actor_lr=1e-2, critic_lr=1e-1)
    params = {"lora": jnp.zeros(3), "value_head": jnp.zeros(2), "backbone": jnp.zeros(5)}
    labels = {"lora": "actor", "value_head": "critic", "backbone": "frozen"}
    tx = make_optimizer(cfg, labels)
    steps = [
        {"lora": np.array([30.0, -40.0, 0.0]), "value_head": np.array([0.0, 120.0]), "backbone": np.full(5, 1e6)},
        {"lora": np.array([0.1, 0.2, -0.3]), "value_head": np.array([0.05, -0.1]), "backbone": np.full(5, 1e6)},
    ]
    state, p = tx.init(params), params
    for g in steps:
        updates, state = tx.update(jax.tree.map(jnp.asarray, g), state, p)
        p = optax.apply_updates(p, updates)
    clipped = []
    for g in steps:
        norm = np.sqrt(np.sum(g["lora"] ** 2) + np.sum(g["value_head"] ** 2))  # frozen excluded
        scale = min(1.0, 1.0 / norm)
        clipped.append({k: g[k] * scale for k in ("lora", "value_head")})
    np.testing.assert_allclose(p["lora"], np_adam([c["lora"] for c in clipped], 1e-2), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(p["value_head"], np_adam([c["value_head"] for c in clipped], 1e-1), rtol=1e-4)
    np.testing.assert_array_equal(p["backbone"], np.zeros(5))


class ToyPolicy(nnx.Module):
    """A frozen 'backbone' with a LoRA adapter, a policy head and a value head."""

    def __init__(self, rngs: nnx.Rngs):
        self.backbone = nnx.Linear(4, 4, rngs=rngs)
        self.lora = nnx.LoRA(4, 2, 4, rngs=rngs)
        self.policy_head = nnx.Linear(4, 2, rngs=rngs)
        self.value_head = nnx.Linear(4, 1, rngs=rngs)

    def __call__(self, x):
        h = self.backbone(x) + self.lora(x)
        return self.policy_head(h), self.value_head(h)[..., 0]


def test_nnx_labels_route_lora_and_heads():
    model = ToyPolicy(nnx.Rngs(0))
    model.lora.lora_b[...] = 0.1 * jnp.ones((2, 4))  # LoRA starts with B = 0, which would zero A's gradient
    state = nnx.state(model, nnx.Param)
    labels = nnx_param_labels(
        state, actor=nnx.Any(nnx.LoRAParam, nnx.PathContains("policy_head")), critic=nnx.PathContains("value_head")
    )
    assert labels["backbone"]["kernel"].get_value() == "frozen"
    assert labels["lora"]["lora_a"].get_value() == "actor" and labels["policy_head"]["bias"].get_value() == "actor"
    assert labels["value_head"]["kernel"].get_value() == "critic"

    tx = make_optimizer(PPOConfig(), labels)
    opt_state = tx.init(state)
    x = jnp.ones((3, 4))

    def loss_fn(st):
        m = nnx.merge(nnx.graphdef(model), st)
        logits, v = m(x)
        return jnp.sum(logits**2) + jnp.sum((v - 1.0) ** 2)

    @jax.jit
    def step(st, opt_state):
        updates, opt_state = tx.update(jax.grad(loss_fn)(st), opt_state, st)
        return optax.apply_updates(st, updates), updates

    new, updates = step(state, opt_state)
    assert all_finite(new)
    # compare the step itself (updates), not new - old: float32 weights near 1 cannot resolve a 1e-6 step to 1 %
    delta = jax.tree.map(lambda u: float(np.abs(np.asarray(u)).max()), updates)
    delta = {"/".join(str(e.key) for e in p[:2]): d for p, d in jax.tree_util.tree_leaves_with_path(delta)}
    assert delta["backbone/kernel"] == 0.0 and delta["backbone/bias"] == 0.0
    for name, lr in (("lora/lora_a", 1e-6), ("lora/lora_b", 1e-6), ("policy_head/kernel", 1e-6),
                     ("value_head/kernel", 1e-5), ("value_head/bias", 1e-5)):
        assert delta[name] == pytest.approx(lr, rel=1e-2), name


def test_nnx_labels_reject_overlapping_filters():
    state = nnx.state(ToyPolicy(nnx.Rngs(0)), nnx.Param)
    with pytest.raises(ValueError, match="both"):
        nnx_param_labels(state, actor=nnx.Param, critic=nnx.PathContains("value_head"))


def test_skip_nonfinite_keeps_old_state_and_counts_under_jit():
    params = {"lora": jnp.zeros(3), "value_head": jnp.zeros(2)}
    tx = make_optimizer(PPOConfig(actor_lr=0.1, critic_lr=0.1), {"lora": "actor", "value_head": "critic"})

    @jax.jit
    def step(params, opt_state, num_skipped, loss, grads):
        return guarded_apply(tx, loss, grads, params, opt_state, num_skipped)[:4]

    opt_state, n = tx.init(params), jnp.int32(0)
    good = {"lora": jnp.ones(3), "value_head": jnp.ones(2)}
    params, opt_state, skipped, n = step(params, opt_state, n, jnp.float32(1.0), good)
    assert not bool(skipped) and int(n) == 0 and float(params["lora"][0]) < 0
    snapshot = jax.tree.map(np.asarray, (params, opt_state))
    bad_cases = [
        (jnp.float32(np.nan), good),
        (jnp.float32(1.0), {"lora": jnp.array([1.0, np.inf, 1.0]), "value_head": jnp.ones(2)}),
        (jnp.float32(1.0), {"lora": jnp.ones(3), "value_head": jnp.array([np.nan, 0.0])}),
    ]
    for i, (loss, grads) in enumerate(bad_cases, start=1):
        params, opt_state, skipped, n = step(params, opt_state, n, loss, grads)
        assert bool(skipped) and int(n) == i
        jax.tree.map(np.testing.assert_array_equal, (params, opt_state), snapshot)  # Adam count too
    params, opt_state, skipped, n = step(params, opt_state, n, jnp.float32(1.0), good)
    assert not bool(skipped) and int(n) == 3 and all_finite(params)
    assert step._cache_size() == 1  # one compilation for good and bad steps alike


def test_skip_nonfinite_catches_overflowing_new_params():
    p = {"w": jnp.array([3e38])}
    new = {"w": jnp.array([np.inf])}
    out = skip_nonfinite(jnp.float32(0.0), {"w": jnp.zeros(1)}, p, (), new, (), 5)
    assert bool(out.skipped) and int(out.num_skipped) == 6
    np.testing.assert_array_equal(out.params["w"], p["w"])


def test_guarded_step_reports_the_parameter_and_update_norms():
    """The norms the divergence checks read: of the parameters before the step and of the proposed change."""
    params = {"a": jnp.array([3.0, 4.0]), "b": jnp.array([0.0], jnp.bfloat16)}
    new = {"a": jnp.array([3.0, 5.0]), "b": jnp.array([2.0], jnp.bfloat16)}
    out = skip_nonfinite(jnp.float32(0.0), params, params, (), new, (), 0)
    assert not bool(out.skipped)
    np.testing.assert_allclose(float(out.param_norm), 5.0)
    np.testing.assert_allclose(float(out.update_norm), np.sqrt(1.0 + 4.0))

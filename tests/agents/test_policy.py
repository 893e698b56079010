"""Policy heads and jitted scoring: statistics against NumPy, sampling, masks, bucketing and compilations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from icml_jax.agents import observation as obs
from icml_jax.agents.policy import (
    MemoryPolicies,
    param_labels,
    planner_act,
    planner_evaluate,
    trigger_act,
    trigger_evaluate,
)
from tests.agents.conftest import tiny_backbone

CFG = obs.ObservationConfig(max_length=64, min_length_bucket=16, max_candidates=7)
HISTORY = [("User", "hello"), ("Assistant", "hi how are you")]


def trigger_batch(tokenizer, memories_per_row):
    options = [obs.trigger_texts(HISTORY, "what do we eat tonight", mems, CFG) for mems in memories_per_row]
    return obs.encode_trigger(tokenizer, options, CFG)


def test_planner_statistics_match_numpy(policies, tokenizer):
    tokens, mask = obs.encode_planner(tokenizer, [obs.planner_text(HISTORY, u, CFG) for u in
                                                  ["i like my dog", "the weather is cold", "bye"]], CFG)
    actions = np.array([1, 0, 1])
    stats = planner_evaluate(policies, jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(actions))
    p = np.asarray(stats.probs, np.float64)
    assert not np.allclose(p, 0.5)
    np.testing.assert_allclose(np.asarray(stats.logp), np.where(actions == 1, np.log(p), np.log1p(-p)), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(stats.entropy), -(p * np.log(p) + (1 - p) * np.log1p(-p)), rtol=1e-5)


def test_trigger_statistics_match_numpy_and_ignore_padding(policies, tokenizer):
    tokens, mask, cand = trigger_batch(tokenizer, [["i like my dog", "no meat please"], []])
    assert tokens.shape[:2] == (2, 4) and cand.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    actions = np.array([2, 0])
    stats = trigger_evaluate(policies, *map(jnp.asarray, (tokens, mask, cand, actions)))
    probs = np.asarray(stats.probs, np.float64)
    assert np.all(probs[~cand] < 1e-12) and np.allclose(probs.sum(-1), 1.0)
    np.testing.assert_allclose(np.asarray(stats.logp), np.log(probs[[0, 1], actions]), rtol=1e-5)
    ent = -np.sum(np.where(cand, probs * np.log(np.where(cand, probs, 1.0)), 0.0), -1)
    np.testing.assert_allclose(np.asarray(stats.entropy), ent, rtol=1e-5, atol=1e-7)
    assert float(stats.entropy[1]) == pytest.approx(0.0, abs=1e-6)  # one real option: no uncertainty


def test_sampling_uses_the_same_numbers_and_follows_the_probabilities(policies, tokenizer):
    tokens, mask, cand = trigger_batch(tokenizer, [["i like my dog", "no meat please", "paris trip"]])
    graphdef, state = nnx.split(policies)
    n = 400  # one row repeated: every row draws with its own key, so one call gives n independent draws
    tile = lambda a: np.repeat(a, n, axis=0)  # noqa: E731
    action, stats = trigger_act(graphdef, state, tile(tokens), tile(mask), tile(cand), jax.random.key(0))
    action = np.asarray(action)
    again = trigger_evaluate(policies, *map(jnp.asarray, (tokens, mask, cand, action[:1])))
    np.testing.assert_allclose(float(stats.logp[0]), float(again.logp[0]), rtol=1e-6)  # the same numbers
    probs = np.asarray(stats.probs[0])
    np.testing.assert_allclose(np.bincount(action, minlength=4) / n, probs, atol=0.08)
    greedy, _ = trigger_act(graphdef, state, tokens, mask, cand, jax.random.key(0), greedy=True)
    assert int(greedy[0]) == int(np.argmax(probs))
    p_tokens, p_mask = obs.encode_planner(tokenizer, ["i like my dog"], CFG)
    saves, p_stats = planner_act(graphdef, state, tile(p_tokens), tile(p_mask), jax.random.key(1))
    assert abs(np.mean(np.asarray(saves)) - float(p_stats.probs[0])) < 0.08


def test_compilations_stay_at_the_number_of_buckets(policies, tokenizer):
    """An episode whose store grows from 0 to 40 memories (capped at 7 by the prefilter) compiles per bucket."""
    graphdef, state = nnx.split(policies)
    trigger_act.clear_cache()
    before = trigger_act._cache_size()
    seen = set()
    memories = [f"memory {i} i like my dog" for i in range(41)]
    for n in range(41):
        shown = memories[: min(n, CFG.max_candidates)]
        tokens, mask, cand = trigger_batch(tokenizer, [shown])
        seen.add(tokens.shape)
        trigger_act(graphdef, state, tokens, mask, cand, jax.random.key(n))
    assert len(seen) <= 3  # candidate buckets 2, 4, 8 at one length bucket
    assert trigger_act._cache_size() - before == len(seen)


def test_mean_pooling_uses_only_real_tokens(tokenizer):
    pol = MemoryPolicies(tiny_backbone(0), pooling="mean", rngs=nnx.Rngs(0))
    pol.planner_actor.kernel[...] = jnp.ones_like(pol.planner_actor.kernel[...])
    short = obs.encode_planner(tokenizer, ["i like my dog"], CFG)
    longer = obs.encode_planner(tokenizer, ["i like my dog", "the weather is cold and rain and sun again"], CFG)
    assert short[0].shape[1] < longer[0].shape[1] or longer[1][0].sum() < longer[1].shape[1]
    a = planner_evaluate(pol, *map(jnp.asarray, short), jnp.zeros(1, jnp.int32)).probs
    b = planner_evaluate(pol, jnp.asarray(longer[0][:1]), jnp.asarray(longer[1][:1]), jnp.zeros(1, jnp.int32)).probs
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5)  # extra left padding changes nothing
    with pytest.raises(ValueError, match="pooling"):
        MemoryPolicies(tiny_backbone(0), pooling="max", rngs=nnx.Rngs(0))


def test_shared_or_separate_backbones():
    shared = MemoryPolicies(tiny_backbone(0), rngs=nnx.Rngs(0))
    assert shared.shared_backbone
    two = MemoryPolicies(tiny_backbone(0), tiny_backbone(1, "llama"), rngs=nnx.Rngs(0))
    assert not two.shared_backbone
    n_shared = sum(x.size for x in jax.tree.leaves(nnx.state(shared, nnx.Param)))
    n_two = sum(x.size for x in jax.tree.leaves(nnx.state(two, nnx.Param)))
    assert n_two > n_shared  # the shared backbone is stored once


def test_param_labels_route_heads_and_freeze_backbone(policies):
    labels = param_labels(policies)
    params = nnx.state(policies, nnx.Param)
    flat = dict(nnx.to_flat_state(labels))
    assert flat[("planner_actor", "kernel")].get_value() == "actor"
    assert flat[("trigger_critic", "bias")].get_value() == "critic"
    assert flat[("planner_backbone", "embedding")].get_value() == "frozen"
    tx = optax.multi_transform({"actor": optax.sgd(1.0), "critic": optax.sgd(1.0),
                                "frozen": optax.set_to_zero()}, labels)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    flat_u = dict(nnx.to_flat_state(updates))
    assert float(jnp.abs(flat_u[("planner_backbone", "embedding")].get_value()).max()) == 0.0
    assert float(jnp.abs(flat_u[("planner_actor", "kernel")].get_value()).min()) == 1.0

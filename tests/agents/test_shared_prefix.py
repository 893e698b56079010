"""The shared-prefix Trigger pass (`MemoryPolicies(shared_prefix=True)`) against the full pass on the same rows:
log-probabilities, values and LoRA/head gradients, the fallback for rows whose options share little, and
compilations (one program per bucket, as without it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import icml_jax.agents.observation as obs
from icml_jax.agents.policy import (
    TRAINABLE,
    MemoryPolicies,
    split_shared_prefix,
    trigger_act,
    trigger_evaluate,
    trigger_forward,
)
from icml_jax.models.lora import LoraConfig, apply_lora
from tests.agents.conftest import randomize_heads, tiny_backbone
from tests.lora_helpers import randomize_adapters

CFG = obs.ObservationConfig(context_turns=2, max_length=64, min_length_bucket=64, max_candidates=7)
HISTORY = [("User", "I love cooking pasta with my friends on sundays"),
           ("Assistant", "That sounds lovely, what sauce do you use?")] * 2
MEMORIES = [["likes pasta", "has a dog named rex who is old", "works at a bank"], ["a b"]]


def rows(tokenizer, config: obs.ObservationConfig = CFG, history=HISTORY, memories=MEMORIES):
    options = [obs.trigger_texts(history[: 4 - 3 * i], "what do we eat tonight", m, config)
               for i, m in enumerate(memories)]
    return tuple(map(jnp.asarray, obs.encode_trigger(tokenizer, options, config)))


def lora_policies(pooling: str, match_rank: int = 0) -> MemoryPolicies:
    backbone = apply_lora(tiny_backbone(0), LoraConfig(rank=4, dropout=0.0))
    randomize_adapters(backbone, seed=3, scale=0.1)
    policies = MemoryPolicies(backbone, pooling=pooling, match_rank=match_rank, suffix_slots=16, rngs=nnx.Rngs(1))
    randomize_heads(policies)
    return policies


def test_split_finds_the_common_prefix(tokenizer):
    tokens, mask, cand = rows(tokenizer)
    split = split_shared_prefix(tokens, mask, cand, 16)
    n = np.asarray(mask.sum(-1))
    k = np.asarray(split.prefix_mask.sum(-1))
    m = np.asarray(split.suffix_mask.sum(-1))
    assert bool(split.fits) and (k > 10).all()
    np.testing.assert_array_equal(np.where(np.asarray(cand), k[:, None] + m, 0), n)  # every token, exactly once
    for b in range(tokens.shape[0]):
        for c in range(int(np.asarray(cand[b]).sum())):
            row = np.asarray(tokens[b, c])[-n[b, c]:]
            joined = np.concatenate([np.asarray(split.prefix[b])[-k[b]:], np.asarray(split.suffix[b, c])[: m[b, c]]])
            np.testing.assert_array_equal(row, joined)


def test_log_probs_values_and_gradients_match_the_full_pass(tokenizer):
    """Mean pooling and the match head: gradients reach the adapters through the prefix's hidden states and its
    cached keys/values ("last" pooling, the cache path alone, is checked for values below)."""
    pooling = "mean"
    tokens, mask, cand = rows(tokenizer)
    policies = lora_policies(pooling, 4)
    actions = jnp.asarray([2, 1])

    @nnx.jit(static_argnames="shared")
    def loss_and_grad(policies, shared):
        def loss(trainable, rest):
            p = nnx.merge(graphdef, trainable, rest)
            logits, value = trigger_forward(p, tokens, mask, cand, shared_prefix=shared)
            logp = jax.nn.log_softmax(logits, -1)
            return jnp.sum(jnp.take_along_axis(logp, actions[:, None], -1)) + jnp.sum(value**2), (logp, value)

        graphdef, trainable, rest = nnx.split(policies, TRAINABLE, ...)
        return jax.value_and_grad(loss, has_aux=True)(trainable, rest)

    (_, (logp_full, v_full)), g_full = loss_and_grad(policies, False)
    (_, (logp_shared, v_shared)), g_shared = loss_and_grad(policies, True)
    real = np.asarray(cand)
    logp_diff = np.abs(np.asarray(logp_full) - np.asarray(logp_shared))[real].max()
    assert logp_diff < 1e-5
    np.testing.assert_allclose(np.asarray(v_shared), np.asarray(v_full), atol=1e-5)
    flat_full, flat_shared = jax.tree.leaves(g_full), jax.tree.leaves(g_shared)
    assert len(flat_full) > 10  # adapters and heads
    grad_diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(flat_full, flat_shared, strict=True))
    scale = max(float(jnp.max(jnp.abs(a))) for a in flat_full)
    assert grad_diff <= 1e-5 * max(scale, 1.0), (grad_diff, scale)
    print(f"{pooling}: max |logp diff| {logp_diff:.2e}, max |grad diff| {grad_diff:.2e} (max |grad| {scale:.2e})")


def test_truncated_rows_fall_back_to_the_full_pass(tokenizer):
    """Rows cut at max_length lose different context tokens, so they share only BOS: the full pass runs."""
    short = obs.ObservationConfig(context_turns=4, max_length=40, min_length_bucket=32, max_candidates=7)
    tokens, mask, cand = rows(tokenizer, short)
    assert int(mask.sum(-1).max()) == 40
    assert not bool(split_shared_prefix(tokens, mask, cand, 16).fits)
    policies = MemoryPolicies(tiny_backbone(0), suffix_slots=16, rngs=nnx.Rngs(1))
    randomize_heads(policies)
    full = trigger_forward(policies, tokens, mask, cand, shared_prefix=False)
    shared = trigger_forward(policies, tokens, mask, cand, shared_prefix=True)
    for a, b in zip(full, shared):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_flag_defaults_off_and_act_compiles_once_per_bucket(tokenizer):
    """'last' pooling: sampling statistics and teacher-forced log-probs as the full pass; one program per bucket."""
    policies = lora_policies("last")
    assert not MemoryPolicies(tiny_backbone(0), rngs=nnx.Rngs(0)).shared_prefix
    tokens, mask, cand = rows(tokenizer)
    actions = jnp.asarray([2, 1])
    evaluate = nnx.jit(trigger_evaluate)
    full = evaluate(policies, tokens, mask, cand, actions)
    policies.shared_prefix = True
    graphdef, state = nnx.split(policies)
    trigger_act.clear_cache()
    for seed in range(3):  # same bucket, different contents: one program
        t, m, c = rows(tokenizer, memories=[MEMORIES[0][seed:] + MEMORIES[0][:seed], MEMORIES[1]])
        trigger_act(graphdef, state, t, m, c, jax.random.key(seed))
    assert trigger_act._cache_size() == 1
    _, stats = trigger_act(graphdef, state, tokens, mask, cand, jax.random.key(0))
    np.testing.assert_allclose(np.asarray(stats.probs), np.asarray(full.probs), atol=1e-5)
    np.testing.assert_allclose(np.asarray(stats.value), np.asarray(full.value), atol=1e-5)
    shared = evaluate(policies, tokens, mask, cand, actions)  # the PPO step's function, flag on
    np.testing.assert_allclose(np.asarray(shared.logp), np.asarray(full.logp), atol=1e-5)


def test_train_mode_dropout_state_advances(tokenizer):
    """With LoRA dropout on (the PPO step's train mode) the pass, inside `lax.cond`, still advances the RNG."""
    backbone = apply_lora(tiny_backbone(0), LoraConfig(rank=4, dropout=0.1))
    policies = MemoryPolicies(backbone, shared_prefix=True, suffix_slots=16, rngs=nnx.Rngs(1))
    policies.train()
    tokens, mask, cand = rows(tokenizer)
    graphdef, params, rest = nnx.split(policies, nnx.Param, ...)

    @jax.jit
    def forward(params, rest):
        local = jax.tree.map(lambda x: x, rest)  # Variables at this trace level, as `rl.ppo.ppo_step` does
        model = nnx.merge(graphdef, params, local)
        return trigger_forward(model, tokens, mask, cand), nnx.state(model, nnx.Not(nnx.Param))

    (logits, value), new_rest = forward(params, rest)
    assert np.isfinite(np.asarray(value)).all() and np.isfinite(np.asarray(logits)).all()
    changed = [bool(np.any(np.asarray(a) != np.asarray(b))) for a, b in
               zip(jax.tree.leaves(rest), jax.tree.leaves(new_rest)) if jnp.issubdtype(a.dtype, jnp.integer)]
    assert any(changed)

"""The jitted joint PPO update on real policies (tiny LoRA backbone): the ratio anchored on the behaviour
policy (clipping in epoch 0 after a policy change, agreement with the recompute option without one), the exact
first-epoch ratio of the recompute option, what the gradients reach, the learning rate of each group, the
non-finite guard, bucket padding, compilations."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from icml_jax.agents.policy import TRAINABLE, MemoryPolicies, planner_evaluate, trainable_group, trigger_evaluate
from icml_jax.models.decoder import Decoder
from icml_jax.models.lora import FROZEN
from icml_jax.rl import DivergenceConfig, DivergenceError, JointUpdater, OldStats, PPOConfig, Slot, collate, ppo_step
from icml_jax.agents.tiny import tiny_model_config
from tests.rl.conftest import randomize_trainable, random_items

ACTOR_LR, CRITIC_LR = 1e-3, 1e-2  # a factor 10 apart, so a mix-up cannot pass
# the tests of the step itself anchor on the first-epoch forward with LoRA dropout on (the "recompute" option);
# the default anchor, the behaviour policy's recorded numbers, has its own tests below
CFG = PPOConfig(actor_lr=ACTOR_LR, critic_lr=CRITIC_LR, epochs=3, minibatch_size=4, old_logp="recompute",
                update_dropout=True)


def minibatches(vocab: int, sizes=(4, 3), seed: int = 0, short: bool = False):
    """Collated minibatches of the given slot counts (a short one is padded with invalid rows)."""
    items = random_items(sum(sizes), vocab, seed=seed, short=short)
    out, i = [], 0
    for n in sizes:
        out.append(collate([Slot(p, t) for p, t in items[i: i + n]], 4))
        i += n
    return out


def flat(state) -> dict[str, np.ndarray]:
    return {"/".join(map(str, p)): np.array(v.get_value()) for p, v in nnx.to_flat_state(state)}


def test_first_epoch_ratio_is_exactly_one_even_with_lora_dropout(lora_kit):
    policies = lora_kit.clone()
    updater = JointUpdater(policies, CFG)
    rng_before = flat(nnx.state(policies, nnx.RngCount))
    result = updater.run(minibatches(lora_kit.vocab), np.random.default_rng(0))
    assert result.steps == 2 * CFG.epochs and result.skipped == 0
    first, later = result.epochs[0], result.epochs[1:]
    for agent in ("planner", "trigger"):
        assert first[f"{agent}/ratio_max_dev"] == 0.0  # bit for bit: old = the training forward itself
        assert first[f"{agent}/clip_fraction"] == 0.0 and first[f"{agent}/approx_kl"] == 0.0
        assert max(e[f"{agent}/ratio_max_dev"] for e in later) > 1e-4  # the policy moved after epoch 0
    metrics = result.metrics()
    assert metrics["update/first_epoch/trigger/clip_fraction"] == 0.0
    for key in ("update/loss", "update/planner/policy_loss", "update/trigger/value_loss", "update/planner/entropy",
                "update/last_epoch/trigger/approx_kl", "update/grad_norm", "update/skipped_steps"):
        assert np.isfinite(metrics[key]), key
    # LoRA dropout drew random numbers in the training forward; the policies are back in eval mode (rollouts).
    rng_after = flat(nnx.state(policies, nnx.RngCount))
    assert rng_after and all(rng_after[k] > rng_before[k] for k in rng_after)
    assert all(getattr(m, "deterministic", True) for _, m in nnx.iter_modules(policies))


def behaviour_stats(policies: MemoryPolicies, batch) -> OldStats:
    """What a rollout records for a collated minibatch's rows: each valid decision scored alone ([1, L], as the
    agent scores a turn), policies in eval mode (LoRA dropout off); 0 on invalid rows."""
    p_eval, t_eval = nnx.jit(planner_evaluate), nnx.jit(trigger_evaluate)
    out = [np.zeros(len(batch.planner.valid), np.float32) for _ in range(4)]
    for i in range(len(out[0])):
        if batch.planner.valid[i]:
            st = p_eval(policies, batch.planner.tokens[i:i + 1], batch.planner.mask[i:i + 1],
                        jnp.asarray(batch.planner.actions[i:i + 1]))
            out[0][i], out[1][i] = float(st.logp[0]), float(st.value[0])
        if batch.trigger.valid[i]:
            t = batch.trigger
            st = t_eval(policies, t.tokens[i:i + 1], t.mask[i:i + 1], t.cand_mask[i:i + 1],
                        jnp.asarray(t.actions[i:i + 1]))
            out[2][i], out[3][i] = float(st.logp[0]), float(st.value[0])
    return OldStats(*out)


def test_after_a_policy_change_replayed_decisions_leave_ratio_one_and_are_clipped_in_epoch_0(lora_kit):
    """Decisions sampled by an older policy, trained on after it changed: the default anchor (the recorded
    log-probabilities) gives ratio != 1 and clipping from the first step; the recompute option hides it."""
    policies = lora_kit.clone()
    batches = minibatches(lora_kit.vocab)
    recorded = [behaviour_stats(policies, b) for b in batches]  # the rollout, under the behaviour policy
    randomize_trainable(policies, seed=11, scale=1.0)  # the policy changes before these decisions are trained on
    config = dataclasses.replace(CFG, epochs=1, old_logp="rollout", update_dropout=False)
    first = {}
    for mode in ("rollout", "recompute"):
        result = JointUpdater(nnx.clone(policies), dataclasses.replace(config, old_logp=mode)).run(
            batches, np.random.default_rng(0), recorded)
        first[mode] = result.epochs[0]
    for agent in ("planner", "trigger"):
        assert first["rollout"][f"{agent}/ratio_max_dev"] > config.clip_eps, first["rollout"]
        assert first["rollout"][f"{agent}/clip_fraction"] > 0.0 and first["rollout"][f"{agent}/approx_kl"] > 0.0
        assert first["recompute"][f"{agent}/ratio_max_dev"] == 0.0 and first["recompute"][f"{agent}/clip_fraction"] == 0


def test_without_a_policy_change_the_rollout_and_recompute_anchors_agree(lora_kit):
    """One minibatch, three epochs, LoRA dropout off in both: the same losses, ratios and final parameters."""
    policies = lora_kit.clone()
    batches = minibatches(lora_kit.vocab, sizes=(4,))
    recorded = [behaviour_stats(policies, b) for b in batches]
    results, params = {}, {}
    for mode in ("rollout", "recompute"):
        clone = nnx.clone(policies)
        results[mode] = JointUpdater(clone, dataclasses.replace(CFG, old_logp=mode, update_dropout=False)).run(
            batches, np.random.default_rng(0), recorded)
        params[mode] = flat(nnx.state(clone, TRAINABLE))
    assert results["rollout"].rollout_logp_gap["trigger"] < 1e-5  # rollout scoring = the update's forward
    for agent in ("planner", "trigger"):
        assert results["rollout"].epochs[0][f"{agent}/ratio_max_dev"] < 1e-5
        assert results["rollout"].epochs[-1][f"{agent}/ratio_max_dev"] > 1e-4  # the policy did move
    for e_rollout, e_recompute in zip(results["rollout"].epochs, results["recompute"].epochs, strict=True):
        for key, value in e_recompute.items():
            np.testing.assert_allclose(e_rollout[key], value, rtol=1e-4, atol=1e-6, err_msg=key)
    for key, value in params["recompute"].items():
        np.testing.assert_allclose(params["rollout"][key], value, atol=1e-6, err_msg=key)


def test_rollout_anchor_needs_the_rollout_statistics(lora_kit):
    updater = JointUpdater(lora_kit.clone(), dataclasses.replace(CFG, old_logp="rollout"))
    with pytest.raises(ValueError, match="old_logp='rollout'.*rollout statistics"):
        updater.run(minibatches(lora_kit.vocab, sizes=(4,)), np.random.default_rng(0))


@pytest.mark.parametrize("lora_lr", [None, 1e-4], ids=["one_actor_lr", "own_lora_lr"])
def test_gradients_reach_only_adapters_and_heads_with_the_right_learning_rate(lora_kit, lora_lr):
    policies = lora_kit.clone()
    updater = JointUpdater(policies, dataclasses.replace(CFG, lora_lr=lora_lr))
    frozen_before, trainable_before = flat(nnx.state(policies, FROZEN)), flat(nnx.state(policies, TRAINABLE))
    assert any("lora" in k for k in trainable_before) and any(k.startswith("trigger_match") for k in trainable_before)
    assert not set(frozen_before) & set(trainable_before)
    # one step: Adam's first update is lr * sign(grad) for every element with a gradient
    updater.run(minibatches(lora_kit.vocab, sizes=(4,)), np.random.default_rng(0), epochs=1)

    frozen_after, trainable_after = flat(nnx.state(policies, FROZEN)), flat(nnx.state(policies, TRAINABLE))
    for key, value in frozen_before.items():
        np.testing.assert_array_equal(frozen_after[key], value, err_msg=f"frozen {key} changed")
    groups = set()
    for key, value in trainable_before.items():
        lr = CRITIC_LR if trainable_group(key) == "critic" else ACTOR_LR
        if lora_lr is not None and trainable_group(key, split_adapters=True) == "adapter":
            lr = lora_lr  # a factor 10 below the heads' actor lr
        groups.add((trainable_group(key), "lora" in key))
        step = np.abs(trainable_after[key] - value)
        assert step.max() <= lr * 1.001, f"{key} moved {step.max()} > lr {lr}"
        if key == "trigger_actor/bias":  # kept for the layout, never added to the scores: no gradient, no step
            np.testing.assert_array_equal(trainable_after[key], value)
            continue
        moved_by_lr = np.isclose(step, lr, rtol=1e-2)
        assert moved_by_lr.mean() > 0.5, f"{key}: only {moved_by_lr.mean():.0%} of its elements moved by lr {lr}"
    assert groups == {("actor", True), ("actor", False), ("critic", False)}


def test_nonfinite_loss_skips_the_step_and_is_counted(lora_kit):
    policies = lora_kit.clone()
    updater = JointUpdater(policies, CFG, DivergenceConfig(max_consecutive_skips=0))  # the guard alone
    bad = minibatches(lora_kit.vocab, sizes=(4,))[0]
    bad = bad._replace(planner=bad.planner._replace(advantages=np.full(4, np.nan, np.float32)))
    before = flat(nnx.state(policies, TRAINABLE))
    opt_before = jax.tree.map(np.array, updater.opt_state)
    result = updater.run([bad], np.random.default_rng(0))
    assert result.skipped == result.steps == CFG.epochs and int(updater.num_skipped) == CFG.epochs
    after = flat(nnx.state(policies, TRAINABLE))
    for key in before:
        np.testing.assert_array_equal(after[key], before[key])
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.array, updater.opt_state), opt_before)
    good = updater.run(minibatches(lora_kit.vocab, sizes=(4,), seed=1), np.random.default_rng(0))
    assert good.skipped == 0 and int(updater.num_skipped) == CFG.epochs
    assert all(np.isfinite(v).all() for v in flat(nnx.state(policies, TRAINABLE)).values())


def test_a_parameter_explosion_stops_the_update_naming_the_step_or_is_rolled_back(lora_kit):
    """lr 1e30 sends the adapters to ~1e30: finite, so the NaN guard lets it through; the norm check does not."""
    exploding = dataclasses.replace(CFG, actor_lr=1e30, critic_lr=1e30)
    policies = lora_kit.clone()
    batches = minibatches(lora_kit.vocab, sizes=(4,))
    before = flat(nnx.state(policies, TRAINABLE))
    with pytest.raises(DivergenceError, match=r"online PPO update diverged at step 1: the update's norm .* x the "
                                              r"parameter norm .*actor_lr"):
        JointUpdater(policies, exploding).run(batches, np.random.default_rng(0))
    updater = JointUpdater(policies, exploding, DivergenceConfig(action="rollback"))
    opt_before = jax.tree.map(np.array, updater.opt_state)
    result = updater.run(batches, np.random.default_rng(0))
    assert result.rolled_back and updater.monitor.rollbacks == 1 and result.metrics()["update/rolled_back"] == 1.0
    after = flat(nnx.state(policies, TRAINABLE))
    for key in before:  # the diverged update never happened
        np.testing.assert_array_equal(after[key], before[key])
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.array, updater.opt_state), opt_before)
    assert int(updater.num_skipped) == 0


def heads_only(vocab: int) -> MemoryPolicies:
    """Policies without LoRA on a fresh tiny backbone (eager forwards are fast; graphs of equal configs match)."""
    policies = MemoryPolicies(Decoder(tiny_model_config(vocab, hidden=32, layers=1), rngs=nnx.Rngs(0)),
                              pooling="mean", match_rank=4, rngs=nnx.Rngs(0))
    randomize_trainable(policies, seed=3)
    return policies


def test_repadding_to_a_larger_bucket_changes_nothing(persona_tokenizer):
    """A short item (length 32, 4 candidates) collated with a long one is left-padded to 64 / 8: same numbers."""
    vocab = len(persona_tokenizer)
    policies = heads_only(vocab)
    (small_p, small_t), = random_items(1, vocab, seed=5, short=True)
    (big_p, big_t), = random_items(1, vocab, seed=6)
    batch = collate([Slot(small_p, small_t), Slot(big_p, big_t)], 4)
    assert batch.planner.tokens.shape == (4, 64) and batch.trigger.tokens.shape == (4, 8, 64)
    assert batch.planner.valid.tolist() == [True, True, False, False]
    planner_eval, trigger_eval = nnx.jit(planner_evaluate), nnx.jit(trigger_evaluate)
    alone_p = planner_eval(policies, small_p.tokens[None], small_p.mask[None], jnp.asarray([small_p.action]))
    alone_t = trigger_eval(policies, small_t.tokens[None], small_t.mask[None], small_t.cand_mask[None],
                               jnp.asarray([small_t.action]))
    p = planner_eval(policies, batch.planner.tokens, batch.planner.mask, batch.planner.actions)
    t = trigger_eval(policies, batch.trigger.tokens, batch.trigger.mask, batch.trigger.cand_mask,
                         batch.trigger.actions)
    for full, alone in ((p, alone_p), (t, alone_t)):
        np.testing.assert_allclose(float(full.logp[0]), float(alone.logp[0]), atol=1e-5)
        np.testing.assert_allclose(float(full.value[0]), float(alone.value[0]), atol=1e-5)
        assert np.isfinite(np.asarray(full.logp)).all()  # invalid padding rows stay finite too


def test_one_compilation_per_bucket_signature(persona_tokenizer):
    """Two bucket signatures over two updates of several epochs: exactly two programs (heads-only policies)."""
    policies = heads_only(len(persona_tokenizer))
    config = dataclasses.replace(CFG, entropy_coef=0.0123)  # a step spec no other test compiles
    updater = JointUpdater(policies, config)
    before = ppo_step._cache_size()
    vocab = len(persona_tokenizer)
    shapes = set()
    for seed in range(2):
        batches = minibatches(vocab, seed=seed) + minibatches(vocab, seed=seed + 10, short=True)
        shapes |= updater.run(batches, np.random.default_rng(seed)).shapes
    assert shapes == {((4, 64), (4, 8, 64)), ((4, 32), (4, 4, 32))}
    assert ppo_step._cache_size() - before == len(shapes) == 2


@pytest.mark.parametrize("old_logp", ["recompute", "rollout"])
def test_runs_of_one_shape_train_in_chunks_as_step_by_step(lora_kit, monkeypatch, old_logp):
    """10 minibatches of one shape: one `ppo_steps` dispatch per 8 steps (and 2 single steps) gives the
    parameters, figures and LoRA dropout draws of 10 single steps, with either anchor of the ratio."""
    from icml_jax.rl import updater as update  # where the updater looks up the step functions and the chunk size

    config = dataclasses.replace(CFG, epochs=2, old_logp=old_logp)
    batches = minibatches(lora_kit.vocab, sizes=(4,) * 10, seed=5)
    rollout = [OldStats(*(np.full(4, v, np.float32) for v in (-0.7, 0.1, -1.5, 0.2))) for _ in batches]
    calls = {"ppo_steps": 0, "ppo_step": 0}

    def counted(name):
        fn = getattr(update, name)

        def call(*args, **kwargs):  # host dispatches only (ppo_steps' trace calls ppo_step inside its scan)
            calls[name] += not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args[-1]))
            return fn(*args, **kwargs)
        return call

    for name in calls:
        monkeypatch.setattr(update, name, counted(name))
    results, states, dispatches = [], [], []
    for steps_per_call in (update.STEPS_PER_CALL, 10**9):  # 10**9: every step dispatched alone
        monkeypatch.setattr(update, "STEPS_PER_CALL", steps_per_call)
        policies = lora_kit.clone()
        results.append(JointUpdater(policies, config).run(batches, np.random.default_rng(3),
                                                            rollout if old_logp == "rollout" else None))
        states.append(flat(nnx.state(policies, (nnx.Param, nnx.RngCount))))
        dispatches.append(dict(calls))
        calls.update(ppo_steps=0, ppo_step=0)
    assert dispatches == [{"ppo_steps": 2, "ppo_step": 4}, {"ppo_steps": 0, "ppo_step": 20}]  # per epoch: 8 + 1 + 1
    chunked, single = results
    assert chunked.steps == single.steps == 20 and chunked.shapes == single.shapes
    for a, b in zip(chunked.epochs, single.epochs, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert states[0].keys() == states[1].keys()
    for k in states[0]:
        np.testing.assert_allclose(states[0][k], states[1][k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert any(not np.array_equal(states[0][k], flat(nnx.state(lora_kit.policies, nnx.Param)).get(k, states[0][k]))
               for k in states[0])  # the update moved something

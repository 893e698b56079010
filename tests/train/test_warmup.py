"""Supervised warm-up: on the persona world it beats the untrained policies by a clear margin (3 seeds), compiles
once per agent, fits the value heads, and its checkpoint restores exactly into fresh policies."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from icml_jax.agents import ObservationConfig
from icml_jax.data.persona_world import PersonaWorldConfig
from icml_jax.llm import OfflineBackend
from icml_jax.models import lora
from icml_jax.synthesis import ExpertData, SynthesisConfig, load_expert_data, synthesize
from icml_jax.synthesis import default_config as synthesis_default_config
from icml_jax.train import WarmupConfig, load_warmup, read_warmup_metadata, supervised, warmup
from icml_jax.rl.divergence import DivergenceConfig, DivergenceError
from icml_jax.checkpoint import flat_trainable
from tests.train.conftest import make_policies

SEEDS = (0, 1, 2)
# Larger lr than the paper's 2e-5: a tiny random backbone, three epochs, a few hundred steps.
CONFIG = WarmupConfig(learning_rate=3e-3, batch_size=8, log_every=100, epochs=2,
                      observation=ObservationConfig(context_turns=1, max_length=64, min_length_bucket=32,
                                                    max_candidates=7))


def synthesis_config(seed: int) -> SynthesisConfig:
    """32 seeds x 3 storylines x 4 prequels of the persona world; a quarter of the seeds held out."""
    return SynthesisConfig(seed=seed, num_seeds=32, world=PersonaWorldConfig(seed=seed, min_user_turns=3),
                           heldout_fraction=0.25, hard_negatives=1, soft_negatives=1)


@pytest.fixture(scope="module")
def runs(world_tokenizer, tmp_path_factory):
    """seed -> (WarmupResult, trained policies, synthesis dir); one compilation per program for all seeds."""
    supervised.train_step_for.cache_clear()
    supervised._score_planner.clear_cache()
    supervised._score_trigger.clear_cache()
    out, template = {}, None
    for seed in SEEDS:
        root = tmp_path_factory.mktemp(f"warmup{seed}")
        synthesize(synthesis_config(seed), OfflineBackend(), root / "data")
        policies = make_policies(len(world_tokenizer), backbone_seed=seed, seed=seed, template=template)
        template = template or policies
        result = warmup(dataclasses.replace(CONFIG, seed=seed), policies, world_tokenizer, root / "data",
                        root / "work")
        out[seed] = (result, policies, root)
    return out


def test_defaults_are_the_papers():
    c = WarmupConfig.from_config(supervised.default_config())
    assert (c.learning_rate, c.epochs, c.batch_size) == (2e-5, 3, 4)
    s = SynthesisConfig.from_config(synthesis_default_config())
    assert (s.storylines_per_seed, s.prequels_per_storyline, s.num_storylines) == (3, 4, 252)
    assert s == SynthesisConfig()
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['lr'\]"):
        WarmupConfig.from_config({"lr": 1e-3})
    assert WarmupConfig.from_config({"observation": {"max_length": 64}}).observation.max_length == 64


def test_schedule_gives_each_agent_its_epochs_interleaved():
    order = supervised.schedule(40, 10, dataclasses.replace(CONFIG, epochs=3, batch_size=8))
    assert order.count("planner") == 15 and order.count("trigger") == 4
    assert order[:5].count("trigger") >= 1 and order[-5:].count("trigger") >= 1  # spread, not blocked


def fact_detector_accuracy(data_dir) -> float:
    """Held-out accuracy, on examples that need a memory, of picking uniformly among the y_p candidates."""
    data = load_expert_data(data_dir)
    eps = {e.episode_id: e for e in data.train_episodes + data.heldout_episodes}
    return float(np.mean([1.0 / sum(bool(eps[c.episode_id].turn(c.ref).y_p) for c in x.candidates)
                          for x in data.heldout_trigger if x.target > 0]))


def test_warmup_beats_the_untrained_policies_by_a_clear_margin(runs):
    rows, needed = [], []
    for seed, (r, _, root) in runs.items():
        b, a = r.before, r.after
        rows.append((a["planner/f1"] - b["planner/f1"], a["trigger/accuracy"] - b["trigger/accuracy"]))
        print(f"seed {seed}: planner F1 {b['planner/f1']:.3f} -> {a['planner/f1']:.3f} (P {a['planner/precision']:.3f}"
              f" R {a['planner/recall']:.3f}, always-save {a['planner/always_save_f1']:.3f}); trigger acc "
              f"{b['trigger/accuracy']:.3f} -> {a['trigger/accuracy']:.3f} (needed {a['trigger/accuracy_needed']:.3f},"
              f" none {a['trigger/accuracy_none']:.3f}, chance {a['trigger/chance_accuracy']:.3f}, n "
              f"{a['trigger/examples']:.0f}); {r.steps} steps, {r.seconds:.1f}s")
        assert r.skipped_steps == 0
        # Held out: storylines of seeds never trained on. Untrained (zero heads) = always save, always "none".
        assert a["planner/f1"] >= b["planner/f1"] + 0.3 and a["planner/f1"] >= a["planner/always_save_f1"] + 0.3
        assert a["planner/precision"] >= 0.8 and a["planner/recall"] >= 0.7
        floor = max(b["trigger/accuracy"], a["trigger/always_none_accuracy"], a["trigger/chance_accuracy"])
        assert a["trigger/accuracy"] >= floor + 0.2
        # Beyond "none" and "is it a fact": where a memory is needed, the positive is picked more often than by a
        # perfect fact detector choosing uniformly among the fact candidates (the soft negative is always a fact).
        # Per seed this margin is small and noisy (~75 such held-out examples); the mean over seeds is asserted.
        detector = fact_detector_accuracy(root / "data")
        print(f"  needed: {a['trigger/accuracy_needed']:.3f} vs fact detector {detector:.3f}")
        needed.append((a["trigger/accuracy_needed"], detector))
    margins, needed = np.array(rows), np.array(needed)
    gap = needed[:, 0].mean() - needed[:, 1].mean()
    print(f"mean margins: planner F1 {margins[:, 0].mean():+.3f}, trigger accuracy {margins[:, 1].mean():+.3f}, "
          f"needed vs fact detector {gap:+.3f}")
    assert margins[:, 0].mean() >= 0.5 and margins[:, 1].mean() >= 0.3
    assert needed[:, 0].mean() >= needed[:, 1].mean() + 0.05


def test_each_program_compiles_once_for_all_seeds(runs):
    result = runs[SEEDS[-1]][0]
    assert result.compilations == {"planner_step": 1, "trigger_step": 1, "score_planner": 1, "score_trigger": 1}


def test_value_heads_fit_the_expert_returns(runs):
    for r, _, _ in runs.values():  # returns are not fully predictable from one turn's observation: a loose bound
        assert r.after["planner/value_mae"] < 0.9 * r.before["planner/value_mae"]
        assert r.after["trigger/value_mae"] < 0.9 * r.before["trigger/value_mae"]


def test_value_loss_reaches_only_the_value_heads(world_tokenizer):
    """critic_only stops gradients everywhere but the critics; the optimizer clips critics and policies apart."""
    policies = make_policies(len(world_tokenizer), backbone_seed=0, seed=0)
    _, params, _, _ = supervised.split_policies(policies)
    grads = jax.grad(lambda p: sum(jnp.sum(x) for x in jax.tree.leaves(supervised.critic_only(p))))(params)
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
        critic = "critic" in jax.tree_util.keystr(path)
        assert np.all(np.asarray(g) == (1.0 if critic else 0.0)), jax.tree_util.keystr(path)
    labels = jax.tree.leaves(supervised.param_groups(params))
    assert labels.count("critic") == 4 and labels.count("actor") == len(labels) - 4


def _scores(policies, tokenizer, data_dir):
    """Planner and trigger logits of the held-out data (eval mode), as NumPy."""
    enc = supervised.encode_data(tokenizer, load_expert_data(data_dir), CONFIG)
    policies.eval()
    graphdef, state = nnx.split(policies)
    p, _ = supervised._score_planner(graphdef, state, enc.planner_heldout["tokens"][:32],
                                     enc.planner_heldout["mask"][:32])
    t, _ = supervised._score_trigger(graphdef, state, enc.trigger_heldout["tokens"][:32],
                                     enc.trigger_heldout["mask"][:32], enc.trigger_heldout["cand_mask"][:32])
    return np.asarray(p), np.asarray(t)


def test_checkpoint_restores_into_fresh_policies_with_identical_scores(runs, world_tokenizer):
    result, trained, root = runs[0]
    meta = read_warmup_metadata(result.checkpoint)
    assert meta["config"]["learning_rate"] == CONFIG.learning_rate and meta["result"]["steps"] == result.steps
    assert json.loads((root / "work" / "warmup" / "metrics.json").read_text())["after"] == result.after
    assert any("lora" in k for k in meta["params"]) and "planner_actor/kernel" in meta["params"]
    # Same backbone weights (as from the same HF checkpoint), other adapter and head initialisation.
    fresh = make_policies(len(world_tokenizer), backbone_seed=0, seed=7, template=runs[SEEDS[-1]][1])
    want = _scores(trained, world_tokenizer, root / "data")
    before = _scores(fresh, world_tokenizer, root / "data")
    assert not np.allclose(before[0], want[0])
    load_warmup(result.checkpoint, fresh)
    got = _scores(fresh, world_tokenizer, root / "data")
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_a_checkpoint_of_other_policies_is_refused_naming_the_tensors(runs, world_tokenizer):
    result = runs[0][0]
    other = make_policies(len(world_tokenizer), backbone_seed=0, seed=0,
                          lora_config=lora.LoraConfig(rank=4, alpha=8.0, dropout=0.0, target_modules=("q", "v")))
    kernel = np.asarray(other.planner_actor.kernel[...])
    with pytest.raises(ValueError, match=r"does not fit these policies \(14 tensor\(s\)\): planner_backbone/layers/"
                                         r"attn/q_lora_a: checkpoint \[2, 64, 8\] float32, policies \[2, 64, 4\]"
                                         r".*6 more"):
        load_warmup(result.checkpoint, other)
    np.testing.assert_array_equal(np.asarray(other.planner_actor.kernel[...]), kernel)  # nothing half-loaded
    with pytest.raises(FileNotFoundError, match="is not a warm-up checkpoint"):
        load_warmup(runs[0][2] / "data", other)


def test_nothing_trains_but_adapters_and_heads(runs, world_tokenizer):
    _, trained, _ = runs[1]
    base = make_policies(len(world_tokenizer), backbone_seed=1, seed=1)
    frozen = lambda p: {k: np.asarray(v.get_raw_value()) for k, v in  # noqa: E731
                        nnx.to_flat_state(nnx.state(p, lora.FROZEN))}
    a, b = frozen(trained), frozen(base)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.allclose(np.asarray(trained.planner_actor.kernel[...]), 0.0)
    assert jnp.asarray(trained.trigger_critic.bias[...]).shape == (1,)


def test_the_online_learner_starts_from_the_warmup_state(runs, world_tokenizer):
    """A warm-up checkpoint loaded into fresh policies is what the online learner trains and acts with."""
    from icml_jax.rl import learner as learner_mod
    from icml_jax.agents import AgentConfig
    from icml_jax.agents.policy import TRAINABLE, planner_evaluate
    from icml_jax.llm import ProxyJudge, QualityJudge
    from icml_jax.memory.store import MemoryStore

    result, trained, root = runs[0]
    fresh = make_policies(len(world_tokenizer), backbone_seed=0, seed=11, template=runs[SEEDS[-1]][1])
    load_warmup(result.checkpoint, fresh)
    backend = OfflineBackend()
    learner = learner_mod.OnlineLearner(
        fresh, world_tokenizer, MemoryStore(), backend, proxy_judge=ProxyJudge(backend),
        quality_judge=QualityJudge(backend),
        config=learner_mod.LearnerConfig(agent=dataclasses.replace(AgentConfig(),
                                                                   observation=CONFIG.observation)))
    want = {k: np.asarray(v.get_raw_value()) for k, v in nnx.to_flat_state(nnx.state(trained, TRAINABLE))}
    got = {k: np.asarray(v.get_raw_value()) for k, v in nnx.to_flat_state(learner.updater.split()[0])}
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
    # Its first decision uses the warmed-up Planner: a held-out fact statement is saved with high probability.
    episode = load_expert_data(root / "data").heldout_episodes[0]
    s, t = next((s, t) for s, sess in enumerate(episode.sessions) for t, turn in enumerate(sess.turns) if turn.y_p)
    history = [(x.speaker, x.text) for x in episode.sessions[s].turns[:t]]
    receipt = learner.step_turn(episode, "u", s, t, history)
    trained.eval()
    ref = planner_evaluate(trained, jnp.asarray(receipt.planner.tokens[None]), jnp.asarray(receipt.planner.mask[None]),
                           jnp.ones((1,), jnp.int32))
    assert receipt.planner.prob_save == pytest.approx(float(ref.probs[0]), abs=1e-5) and receipt.planner.prob_save > 0.9


def small_data(root, episodes: int = 8) -> ExpertData:
    """The first `episodes` training and held-out episodes of a synthesis directory, with their Trigger examples
    (the tests below need a few windows of steps, not the learning run's data)."""
    data = load_expert_data(root / "data")
    train, heldout = data.train_episodes[:episodes], data.heldout_episodes[:episodes]
    keep = lambda examples, eps: tuple(x for x in examples if x.episode_id in {e.episode_id for e in eps})  # noqa: E731
    return dataclasses.replace(data, train_episodes=train, train_trigger=keep(data.train_trigger, train),
                               heldout_episodes=heldout, heldout_trigger=keep(data.heldout_trigger, heldout))


def test_warmup_shows_a_bar_over_its_steps(runs, world_tokenizer, capsys):
    """One epoch on part of seed 0's data with policies of the same structure (nothing compiles again)."""
    _, template, root = runs[0]
    policies = make_policies(len(world_tokenizer), backbone_seed=0, seed=0, template=template)
    scorers = {"score_planner": supervised._score_planner._cache_size(),  # other tests' structures count too
               "score_trigger": supervised._score_trigger._cache_size()}
    result = warmup(dataclasses.replace(CONFIG, epochs=1), policies, world_tokenizer, small_data(root), None)
    assert result.steps >= 8
    err = capsys.readouterr().err
    assert "warm-up steps" in err and f"0/{result.steps}" in err
    assert result.compilations == {"planner_step": 1, "trigger_step": 1, **scorers}


def test_a_diverging_warmup_stops_naming_the_step_or_rolls_back_every_diverged_window(runs, world_tokenizer):
    """lr 1e30: the first step sends the adapters to ~1e30 (finite, so the NaN guard alone would let the run go on
    skipping every later step). 'stop' fails at step 1; 'rollback' restores the last good state each window."""
    _, template, root = runs[0]
    exploding = dataclasses.replace(CONFIG, epochs=1, learning_rate=1e30, batch_size=32, log_every=4)
    policies = make_policies(len(world_tokenizer), backbone_seed=0, seed=0, template=template)
    before = {k: np.array(v.get_value()) for k, v in flat_trainable(policies).items()}
    with pytest.raises(DivergenceError, match=r"warm-up diverged at step 1: the update's norm .* x the "
                                              r"parameter norm .*\((planner|trigger) step\).*learning_rate"):
        warmup(exploding, policies, world_tokenizer, root / "data", None)
    rollback = dataclasses.replace(exploding, divergence=DivergenceConfig(action="rollback", max_rollbacks=1000))
    result = warmup(rollback, policies, world_tokenizer, small_data(root, episodes=32), None)
    windows = -(-result.steps // rollback.log_every)
    assert windows >= 3 and result.rollbacks == windows and all(row["rolled_back"] == 1.0 for row in result.history)
    for key, value in flat_trainable(policies).items():  # every window was undone
        np.testing.assert_array_equal(np.array(value.get_value()), before[key], err_msg=key)
    # (the rollback budget, max_rollbacks, is checked on the monitor itself: tests/rl/test_divergence.py)


def test_expert_planner_rewards_are_on_the_online_training_scale():
    """The value targets use the online reward formulas and the same [0, 1] normalisation (or none, raw)."""
    from icml_jax.data.schema import TurnRef
    from icml_jax.rl import RewardConfig, planner_reward_bounds
    from icml_jax.synthesis import PlannerExample

    examples = [PlannerExample("e", TurnRef(0, 0), (), "I am vegan.", True, 1.0, True),  # r_truth 1 + 0.5 * 1
                PlannerExample("e", TurnRef(0, 1), (), "Nice weather.", False, 0.0, False),  # discard, low value
                PlannerExample("e", TurnRef(0, 2), (), "I have a cat.", True, 0.8, False)]  # untriggered: 0.8
    raw = np.array([1.5, 0.0, 0.8], np.float32)
    rewards = RewardConfig()
    low, high = planner_reward_bounds(rewards)
    got = supervised.planner_expert_rewards(examples, WarmupConfig(rewards=rewards))
    np.testing.assert_allclose(got, (raw - low) / (high - low), rtol=1e-6)
    raw_config = WarmupConfig(rewards=dataclasses.replace(rewards, normalize=False))
    np.testing.assert_allclose(supervised.planner_expert_rewards(examples, raw_config), raw, rtol=1e-6)

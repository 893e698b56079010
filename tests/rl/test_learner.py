"""The online learner (Algorithm 1): truth rewards across sessions of one user and never across users, judge
failures masked and counted, exact recomputation of rollout log-probabilities, metrics, checkpoint round trip."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from icml_jax.agents.agent import AgentConfig
from icml_jax.agents.policy import TRAINABLE
from icml_jax.data.labels import planner_precision_recall, trigger_recall
from icml_jax.data.persona_world import generate_episodes
from icml_jax.data.schema import Episode, Session, Turn, TurnRef
from icml_jax.llm.judges import ProxyJudge, QualityJudge
from icml_jax.llm.offline import OfflineBackend
from icml_jax.llm.types import TASK_PROXY_JUDGE, TASK_QUALITY_JUDGE, LLMResponse
from icml_jax.memory.store import MemoryStore
from icml_jax.rl import (LearnerConfig, OnlineLearner, PPOConfig, RewardConfig, pooled_metrics, ppo_step,
                          session_counts)
from icml_jax.agents.tiny import learning_observation, learning_world
from icml_jax.experiments.persona_run import PersonaRunConfig, build_learner
from tests.rl.conftest import force_policies, randomize_trainable

RUN = PersonaRunConfig()  # the learning test's model and PPO settings: compiled programs are shared with it
NURSE, TIRED, WEEK = "I work as a nurse.", "I'm a bit tired today.", "How should I plan my week around work?"


def two_session_episode(episode_id: str) -> Episode:
    """Session 0 states a fact; session 1 asks what needs it, then chats."""
    return Episode("test", episode_id, (
        Session((Turn("user", NURSE, y_p=True, y_t=()),)),
        Session((Turn("user", WEEK, y_p=False, y_t=(TurnRef(0, 0),)), Turn("user", TIRED, y_p=False, y_t=()))),
    ))


def test_truth_reward_flows_across_sessions_of_one_user_never_across_users(tmp_path, monkeypatch):
    """Forced policy: save every turn, use the newest memory. Two users with identical dialogues, one update."""
    force_policies(monkeypatch, lambda cand_mask: cand_mask.sum(-1) - 1)  # the newest memory
    learner, _ = build_learner(dataclasses.replace(RUN, update_every=2), tmp_path)
    learner.run_episode(two_session_episode("A"))
    receipts_a = learner.last_receipts
    out = learner.run_episode(two_session_episode("B"))
    receipts_b = learner.last_receipts

    own = {u: {f.fragment_id for f in learner.store.fragments(u)} for u in ("A", "B")}
    assert len(own["A"]) == len(own["B"]) == 3 and not own["A"] & own["B"]
    for user, receipts in (("A", receipts_a), ("B", receipts_b)):
        for r in receipts:
            assert set(r.trigger.candidate_ids) <= own[user]  # a user's Trigger only ever sees its own memories
        assert [r.trigger.fragment_id is not None for r in receipts] == [False, True, True]
    cost, lam = RUN.reward.save_cost, RUN.reward.truth_lambda
    rewards = {s.decision_id: s for s in learner.last_finalized}
    assert len(rewards) == 6
    for user in ("A", "B"):
        nurse = rewards[f"{user}/{user}/0/0/planner"]  # saved in session 0, used by the query of session 1
        assert nurse.user_id == user and nurse.triggered and nurse.r_qual_future == pytest.approx(0.9)
        assert nurse.reward == pytest.approx(1.0 - cost + lam * 0.9)
        week = rewards[f"{user}/{user}/1/0/planner"]  # used by the chit-chat after it: a poor use of a memory
        assert week.triggered and week.reward == pytest.approx(0.0 - cost + lam * 0.55)
        tired = rewards[f"{user}/{user}/1/1/planner"]
        assert not tired.triggered and tired.reward == pytest.approx(-cost)
    stats = learner.buffer.stats
    assert stats["triggers_assigned"] == 4 and stats["triggers_user_mismatch"] == 0 and len(learner.buffer) == 0
    assert out["rewards/truth_triggered_saves"] == 4.0
    assert out["rewards/truth_bonus"] == pytest.approx(lam * (0.9 + 0.55) / 2)
    # Table 8's log: each finalized save's session (of the saved turn), r_proxy and r_qual(future)
    logged = sorted((e.session, e.r_proxy, -1.0 if e.r_qual_future is None else e.r_qual_future)
                    for e in learner.save_log)
    expected = [(0, 1.0, 0.9)] * 2 + [(1, 0.0, -1.0)] * 2 + [(1, 0.0, 0.55)] * 2
    assert np.asarray(logged) == pytest.approx(np.asarray(expected))


class Flaky:
    """The offline back end, except for unusable judge answers on chosen turns."""

    name = "flaky"

    def __init__(self, fail_quality: str, fail_proxy: str) -> None:
        self.inner, self.fail_quality, self.fail_proxy = OfflineBackend(), fail_quality, fail_proxy

    @property
    def usage(self):
        return self.inner.usage

    def close(self) -> None:
        pass

    def generate(self, requests):
        out = []
        for request, response in zip(requests, self.inner.generate(requests), strict=True):
            md = request.metadata
            bad = ((request.task == TASK_QUALITY_JUDGE and self.fail_quality in md.get("utterance", ""))
                   or (request.task == TASK_PROXY_JUDGE and self.fail_proxy in md.get("turn_text", "")))
            out.append(LLMResponse(text="no json here", parse_error="not JSON") if bad else response)
        return out


def test_judge_failures_are_masked_and_counted_and_rollout_logps_are_recomputed_exactly(tmp_path):
    """lr 0: the update's recomputed log-probs equal the rollout's; failed judgements leave their decision out."""
    base, tokenizer = build_learner(RUN, tmp_path)
    randomize_trainable(base.policies, seed=4)  # non-uniform policies, so the log-prob check means something
    episode = generate_episodes(learning_world(), 1, start_index=77)[0]
    user_turns = [t for s in episode.sessions for t in s.turns if t.speaker == "user"]
    flaky = Flaky(fail_quality="?", fail_proxy=user_turns[0].text)
    config = LearnerConfig(ppo=dataclasses.replace(RUN.ppo, actor_lr=0.0, critic_lr=0.0), reward=RUN.reward,
                           agent=AgentConfig(observation=learning_observation()), seed=3)
    learner = OnlineLearner(base.policies, tokenizer, MemoryStore(), OfflineBackend(), proxy_judge=ProxyJudge(flaky),
                            quality_judge=QualityJudge(flaky), config=config)
    before = jax.tree.map(np.array, nnx.to_pure_dict(nnx.state(base.policies, TRAINABLE)))
    out = learner.run_episode(episode)

    q_fail = sum("?" in t.text for t in user_turns)
    p_fail = sum(user_turns[0].text in t.text for t in user_turns)
    assert q_fail and p_fail
    assert out["judge/quality_failures"] == q_fail and out["judge/proxy_failures"] == p_fail
    assert out["update/decisions/trigger"] == len(user_turns) - q_fail
    assert out["update/decisions/planner"] == len(user_turns) - p_fail
    for agent in ("planner", "trigger"):
        assert out[f"update/{agent}/rollout_logp_gap"] < 1e-5  # teacher-forced recomputation = rollout numbers
        assert out[f"update/first_epoch/{agent}/clip_fraction"] == 0.0
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.array, nnx.to_pure_dict(
        nnx.state(base.policies, TRAINABLE))), before)
    assert out["update/programs"] == 1 and ppo_step._cache_size() >= 1
    for key in ("rewards/trigger", "rewards/planner", "update/loss", "update/planner/policy_loss",
                "update/trigger/value_loss", "update/last_epoch/trigger/clip_fraction",
                "update/last_epoch/planner/approx_kl", "update/trigger/entropy", "agent/save_rate",
                "update/skipped_steps", "update/total_skipped_steps", "llm/tokens", "labels/planner_precision",
                "labels/planner_recall", "labels/trigger_recall"):
        assert key in out and not np.isnan(out[key]), key
    assert out["llm/tokens"] > 0
    # the learner's label counts agree with icml_jax.data.labels on the same decisions
    receipts = learner.last_receipts
    saved = [TurnRef(r.session, r.turn) for r in receipts if r.planner.save]
    used = {TurnRef(r.session, r.turn): [TurnRef(r.memory_used.session, r.memory_used.turn)]
            for r in receipts if r.memory_used is not None}
    precision, recall = planner_precision_recall(episode, saved)
    counts = session_counts(episode, receipts)
    assert sum(c.correct_saves for c in counts) / max(1, sum(c.saves for c in counts)) == pytest.approx(
        precision if saved else 0.0)
    assert sum(c.correct_saves for c in counts) / sum(c.gold_saves for c in counts) == pytest.approx(recall)
    assert sum(c.recalled for c in counts) / sum(c.needed for c in counts) == pytest.approx(
        trigger_recall(episode, used))


def test_state_dict_round_trip_resumes_bit_for_bit(lora_kit, persona_tokenizer):
    """LoRA (dropout on): a learner restored from a checkpoint continues exactly like the original."""
    config = LearnerConfig(ppo=PPOConfig(actor_lr=1e-3, critic_lr=1e-2, epochs=2, minibatch_size=4),
                           reward=RewardConfig(save_cost=0.5), agent=AgentConfig(observation=learning_observation()),
                           seed=5)

    def make(policies, seed):
        backend = OfflineBackend()
        return OnlineLearner(policies, persona_tokenizer, MemoryStore(), backend, proxy_judge=ProxyJudge(backend),
                             quality_judge=QualityJudge(backend), config=dataclasses.replace(config, seed=seed))

    first, second = generate_episodes(learning_world(), 2, start_index=200)
    original, restored = make(lora_kit.clone(), 5), make(lora_kit.clone(), 6)
    original.run_episode(first)
    state = original.state_dict()
    assert state["counters"]["updates"] == 1 and state["rest"]  # dropout RNG state travels with the checkpoint
    first_key = next(iter(state["params"]))
    with pytest.raises(ValueError, match=f"params: missing \\['{first_key}'\\]"):
        restored.load_state_dict(dict(state, params={k: v for k, v in state["params"].items() if k != first_key}))
    restored.load_state_dict(state)
    out_a, out_b = original.run_episode(second), restored.run_episode(second)
    timing = ("update/seconds", "update/wall_since_last", "llm/tokens")
    assert {k: v for k, v in out_a.items() if k not in timing} == pytest.approx(
        {k: v for k, v in out_b.items() if k not in timing}, nan_ok=True)
    a, b = original.state_dict(), restored.state_dict()
    jax.tree.map(np.testing.assert_array_equal, a["params"], b["params"])
    jax.tree.map(np.testing.assert_array_equal, a["optimizer"], b["optimizer"])
    assert a["buffer"] == b["buffer"] and a["rng"] == b["rng"] and a["counters"] == b["counters"]
    assert a["save_log"] == b["save_log"] and len(a["save_log"]) > len(state["save_log"]) > 0  # resumed, then grew
    np.testing.assert_array_equal(a["agent_key"], b["agent_key"])
    original.step_turn(second, second.episode_id, 0, 0, [])
    with pytest.raises(RuntimeError, match="checkpoint right after an update"):
        original.state_dict()


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="update_every"):
        LearnerConfig(update_every=0)
    with pytest.raises(ValueError, match="greedy"):
        LearnerConfig(agent=AgentConfig(greedy=True))


def test_user_speaker_none_acts_at_every_turn_of_a_real_two_speaker_episode(tmp_path):
    """Real-data format (GapChat, two speakers, no labels): with user_speaker None every turn gets a receipt,
    the memory is the episode user's, the update runs; `evaluate` honours user_speaker the same way."""
    from pathlib import Path

    from icml_jax.data.sources import parse_gapchat
    from icml_jax.rl.heldout import evaluate

    fixture = Path(__file__).resolve().parents[1] / "data" / "fixtures" / "gapchat" / "test" / "4_session.json"
    episode = next(e for e in parse_gapchat(fixture) if e.episode_id == "gapchat-test-4-1")
    every = [(s, t) for s, session in enumerate(episode.sessions) for t in range(len(session.turns))]
    assert len(every) == 6 and {turn.speaker for s in episode.sessions for turn in s.turns} == {"speaker_1",
                                                                                                "speaker_2"}
    learner, tokenizer = build_learner(RUN, tmp_path)
    with pytest.raises(ValueError, match="no turn of speaker 'user'.*LearnerConfig.user_speaker"):
        learner.run_episode(episode)
    learner.config = dataclasses.replace(learner.config, user_speaker=None)
    out = learner.run_episode(episode)
    receipts = learner.last_receipts
    assert [(r.session, r.turn) for r in receipts] == every and out["episode/turns"] == 6.0
    assert {r.user_id for r in receipts} == {episode.episode_id} and "update/index" in out
    saved = {r.fragment.fragment_id for r in receipts if r.fragment is not None}
    assert saved == {f.fragment_id for f in learner.store.fragments(episode.episode_id)}
    assert [c.turns for c in learner.session_log] == [2, 2, 2]

    agent_cfg = AgentConfig(observation=learning_observation())
    both = evaluate(learner.policies, tokenizer, [episode], agent_config=agent_cfg, user_speaker=None)
    one = evaluate(learner.policies, tokenizer, [episode], agent_config=agent_cfg, user_speaker="speaker_1")
    assert [c.turns for c in both] == [2, 2, 2] and [c.turns for c in one] == [1, 1, 1]


@pytest.mark.parametrize("normalize", [True, False])
def test_the_planner_trains_on_rewards_normalised_to_0_1_unless_told_otherwise(tmp_path, normalize):
    """gamma 0: the Planner's training returns are its rewards, mapped from [-alpha, 1 - cost + lambda] onto
    [0, 1] by default; the logged rewards stay raw."""
    from icml_jax.rl import planner_reward_bounds

    reward = dataclasses.replace(RUN.reward, normalize=normalize)
    learner, _ = build_learner(dataclasses.replace(RUN, reward=reward), tmp_path)
    learner.updater.config = dataclasses.replace(learner.updater.config, epochs=1)
    seen = []
    real_run = learner.updater.run
    learner.updater.run = lambda minibatches, rng, rollout=None, **kw: (seen.extend(minibatches),
                                                                        real_run(minibatches, rng, rollout, **kw))[1]
    out = learner.run_episode(generate_episodes(learning_world(), 1, start_index=5)[0])
    returns = np.concatenate([np.asarray(mb.planner.returns)[np.asarray(mb.planner.valid)] for mb in seen])
    low, high = planner_reward_bounds(reward)
    raw_mean = out["rewards/planner"]
    assert low < raw_mean < high and len(returns) == out["update/decisions/planner"]
    want = (raw_mean - low) / (high - low) if normalize else raw_mean
    assert returns.mean() == pytest.approx(want, abs=1e-5)
    if normalize:
        assert returns.min() >= 0.0 and returns.max() <= 1.0


def test_saving_an_already_saved_fact_counts_as_a_duplicate():
    from types import SimpleNamespace

    def turn(text, fact=None, y_p=False):
        return Turn("user", text, y_p=y_p, y_t=(), meta={"fact": fact} if fact else {})

    ep = Episode("pw", "d", (Session((turn("I am vegan.", "diet: vegan", True), turn("Hi.", None))),
                             Session((turn("I only eat vegan food.", "diet: vegan"), turn("I am a nurse.", "job: nurse",
                                                                                          True))),
                             Session((turn("Vegan, as you know.", "diet: vegan"),))))
    saves = {(0, 0): True, (0, 1): True, (1, 0): True, (1, 1): True, (2, 0): False}
    receipts = [SimpleNamespace(session=s, turn=t, planner=SimpleNamespace(save=v), memory_used=None)
                for (s, t), v in saves.items()]
    counts = session_counts(ep, receipts)
    assert [c.duplicate_saves for c in counts] == [0, 1, 0]
    pooled = pooled_metrics(counts, "m")
    assert pooled["m/duplicate_saves"] == 1.0 and pooled["m/duplicate_save_rate"] == pytest.approx(1 / 4)
    # 2 high-value turns, both saved; 3 others, 2 of them saved
    assert pooled["m/planner_miss_rate"] == 0.0 and pooled["m/planner_false_positive_rate"] == pytest.approx(2 / 3)

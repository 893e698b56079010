"""Batched play (`learner.users_in_flight`): B users in lockstep, their decisions in one forward pass each, give
every user the decisions, memories and rewards of playing them one by one, and keep users apart."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from icml_jax.agents.policy import TRAINABLE
from icml_jax.data.persona_world import generate_episodes
from icml_jax.experiments.persona_run import PersonaRunConfig, build_learner
from icml_jax.llm.judges import ProxyJudge, QualityJudge
from icml_jax.llm.offline import OfflineBackend
from icml_jax.memory.store import MemoryStore
from icml_jax.rl import OnlineLearner, evaluate
from icml_jax.rl.learner import LearnerConfig
from icml_jax.rl.rollout import lockstep, user_groups
from tests.rl.conftest import randomize_trainable

RUN = PersonaRunConfig()  # the learning test's settings: compiled programs are shared with it
USERS = 4


def short(episode, sessions: int = 2):
    """The episode's first `sessions` sessions (the test needs cross-session recall, not length)."""
    return dataclasses.replace(episode, sessions=episode.sessions[:sessions])


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    base, tokenizer = build_learner(RUN, tmp_path_factory.mktemp("tok"))
    randomize_trainable(base.policies, seed=3, scale=1.0)  # decisions far from uniform, and not all alike
    episodes = [short(e) for e in generate_episodes(RUN.world, USERS)]
    return base, tokenizer, episodes


def play(kit, users_in_flight: int):
    """A fresh learner (same initial policies, update every 4 episodes) plays the episodes B at a time."""
    base, tokenizer, episodes = kit
    backend = OfflineBackend()
    config = dataclasses.replace(base.config, update_every=USERS, users_in_flight=users_in_flight)
    learner = OnlineLearner(nnx.clone(base.policies), tokenizer, MemoryStore(), backend,
                            proxy_judge=ProxyJudge(backend), quality_judge=QualityJudge(backend), config=config)
    receipts, metrics = {}, []
    for group in user_groups(episodes, users_in_flight, config.update_every):
        turns_before = len(learner._turns)
        metrics += learner.run_episodes(group)
        assert not learner._turns or len(learner._turns) > turns_before
    for record in learner.last_records:
        receipts.setdefault(record.receipt.user_id, []).append(record)
    return learner, receipts, metrics


def decisions(records):
    """What must be equal exactly: per turn the choices, the memories they touched, the reply and the rewards."""
    out = []
    for rec in records:
        r = rec.receipt
        out.append((r.session, r.turn, r.trigger.candidate_ids, r.trigger.action, r.planner.save, r.reply,
                    r.memory_used and r.memory_used.fragment_id,
                    r.fragment and (r.fragment.fragment_id, r.fragment.text, r.replaced),
                    rec.r_qual, rec.r_proxy, rec.planner_reward))
    return out


def test_four_users_in_flight_equal_one_by_one(kit):
    one, rec_one, m_one = play(kit, 1)
    four, rec_four, m_four = play(kit, USERS)
    assert sorted(rec_one) == sorted(rec_four) and len(rec_one) == USERS
    saves = recalls = 0
    for user in rec_one:
        assert decisions(rec_four[user]) == decisions(rec_one[user]), user
        saves += sum(r.receipt.fragment is not None for r in rec_one[user])
        recalls += sum(r.receipt.memory_used is not None for r in rec_one[user])
        for a, b in zip(rec_four[user], rec_one[user], strict=True):  # batched forward: float rounding only
            for x, y in ((a.receipt.trigger, b.receipt.trigger), (a.receipt.planner, b.receipt.planner)):
                np.testing.assert_allclose([x.logp, x.value], [y.logp, y.value], atol=1e-5)
                np.testing.assert_array_equal(x.tokens, y.tokens)  # the rows as scored alone: same update input
        stored = [(f.fragment_id, f.text, f.superseded_by) for f in four.store.fragments(user)]
        assert stored == [(f.fragment_id, f.text, f.superseded_by) for f in one.store.fragments(user)]
    assert saves >= 2 and recalls >= 2, (saves, recalls)  # the comparison covers saves and cross-session recalls
    assert four.updates == one.updates == 1
    assert [sorted(m) for m in m_four] == [sorted(m) for m in m_one]
    for k in ("rewards/trigger", "rewards/planner", "update/decisions/planner", "update/decisions/trigger"):
        np.testing.assert_allclose(m_four[-1][k], m_one[-1][k], rtol=1e-6)
    # the same update on the same slots: parameters equal up to the rollout figures' float rounding
    p1, p4 = (jax.tree.leaves(nnx.state(x.policies, TRAINABLE)) for x in (one, four))
    for a, b in zip(p4, p1, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_users_stay_apart_in_a_batch(kit):
    """Each user's Trigger sees only its own memories and the truth reward goes to its own saves."""
    learner, receipts, _ = play(kit, USERS)
    for user, records in receipts.items():
        own = {f.fragment_id for f in learner.store.fragments(user)}
        for rec in records:
            assert set(rec.receipt.trigger.candidate_ids) <= own
            if rec.receipt.fragment is not None:
                assert rec.receipt.fragment.fragment_id in own
    for save in learner.last_finalized:
        assert save.decision_id.startswith(save.user_id + "/")


def test_groups_respect_users_and_updates():
    eps = [dataclasses.replace(e, episode_id=i) for e, i in zip(generate_episodes(RUN.world, 7),
                                                                 "a b c a d e f".split())]
    ids = [[e.episode_id for e in g] for g in user_groups(eps, 4, 4)]
    assert ids == [["a", "b", "c"], ["a"], ["d", "e", "f"]]  # a repeated user closes its group; 4 ends one
    ids = [[e.episode_id for e in g] for g in user_groups(eps[4:], 2, 4, seen=3)]
    assert ids == [["d"], ["e", "f"]]  # resuming mid-way: the first group stops at the update after 3 + 1
    assert list(lockstep([[(1,), (2,)], [(3,)]])) == [[(0, 1), (1, 3)], [(0, 2)]]
    with pytest.raises(ValueError, match="users_in_flight must be a positive int dividing update_every=4"):
        LearnerConfig(update_every=4, users_in_flight=3)


def test_batched_evaluation_equals_one_by_one(kit):
    """Held-out evaluation, greedy and sampled: the label counts of 4 users in flight equal those of 1."""
    base, tokenizer, episodes = kit
    for greedy in (True, False):
        runs = [evaluate(base.policies, tokenizer, episodes, agent_config=base.config.agent, greedy=greedy,
                         users_in_flight=b, seed=5) for b in (1, USERS)]
        assert runs[0] == runs[1], greedy
    assert sum(c.saves for c in runs[0]) > 0 and sum(c.needed for c in runs[0]) > 0

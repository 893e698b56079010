"""Pending Reward Buffer: truth reward within one user across sessions, never across users, all policies,
JSON round trip, and a hypothesis state machine against a plain-Python model."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from icml_jax.rl import (
    ASSIGNED,
    REPEAT,
    UNTRACKED,
    USER_MISMATCH,
    PendingRewardBuffer,
    RewardConfig,
    UserMismatchError,
)


def by_decision(rewards):
    return {r.decision_id: r for r in rewards}


def test_truth_reward_reaches_the_save_decision_across_sessions_of_one_user():
    buf = PendingRewardBuffer(RewardConfig(truth_lambda=0.5))
    # session 1 of alice: two saves; session 1 of bob: one save
    buf.add(fragment_id="fa1", user_id="alice", decision_id="p:alice:s1:t2", r_proxy=0.6, created_ref=("ep", 1, 2))
    buf.add(fragment_id="fa2", user_id="alice", decision_id="p:alice:s1:t5", r_proxy=0.3)
    buf.add(fragment_id="fb1", user_id="bob", decision_id="p:bob:s1:t1", r_proxy=0.9)
    # session 3 of alice retrieves fa1; reply quality 0.8
    assert buf.on_trigger("alice", "fa1", 0.8, turn_ref=("ep", 3, 4)) == ASSIGNED
    assert buf.status("fa1") == "triggered" and buf.status("fa2") == "pending"
    out = by_decision(buf.finalize())
    assert out["p:alice:s1:t2"].reward == pytest.approx(0.6 + 0.5 * 0.8)
    assert out["p:alice:s1:t2"].triggered and out["p:alice:s1:t2"].r_qual_future == pytest.approx(0.8)
    assert out["p:alice:s1:t5"].reward == pytest.approx(0.3) and not out["p:alice:s1:t5"].triggered
    assert out["p:bob:s1:t1"].reward == pytest.approx(0.9) and out["p:bob:s1:t1"].r_qual_future is None
    assert len(buf) == 0


def test_never_across_users_raise_policy_changes_nothing():
    buf = PendingRewardBuffer(RewardConfig())
    buf.add(fragment_id="f", user_id="alice", decision_id="d", r_proxy=0.5)
    before = buf.state_dict()
    with pytest.raises(UserMismatchError, match="bob.*alice"):
        buf.on_trigger("bob", "f", 1.0)
    assert buf.state_dict() == before
    (reward,) = buf.finalize()
    assert reward.reward == pytest.approx(0.5) and not reward.triggered


def test_never_across_users_count_policy_ignores_and_counts():
    buf = PendingRewardBuffer(RewardConfig(user_mismatch="count"))
    buf.add(fragment_id="f", user_id="alice", decision_id="d", r_proxy=0.5)
    assert buf.on_trigger("bob", "f", 1.0) == USER_MISMATCH
    assert buf.stats["triggers_user_mismatch"] == 1
    assert buf.status("f") == "pending"
    assert buf.on_trigger("alice", "f", 0.2) == ASSIGNED
    (reward,) = buf.finalize()
    assert reward.reward == pytest.approx(0.5 + 0.5 * 0.2)


@pytest.mark.parametrize("policy, want", [("first", 0.2), ("max", 0.9), ("mean", 0.5)])
def test_multi_trigger_policies(policy, want):
    buf = PendingRewardBuffer(RewardConfig(multi_trigger=policy, truth_lambda=1.0))
    buf.add(fragment_id="f", user_id="u", decision_id="d", r_proxy=0.0)
    outcomes = [buf.on_trigger("u", "f", q) for q in (0.2, 0.9, 0.4)]
    assert outcomes == ([ASSIGNED, REPEAT, REPEAT] if policy == "first" else [ASSIGNED] * 3)
    (reward,) = buf.finalize()
    assert reward.reward == pytest.approx(want) and reward.r_qual_future == pytest.approx(want)
    assert reward.num_triggers == (1 if policy == "first" else 3)


def test_untriggered_proxy_finalizes_every_save_and_late_triggers_are_untracked():
    buf = PendingRewardBuffer(RewardConfig(untriggered="proxy", save_cost=0.1))
    buf.add(fragment_id="f", user_id="u", decision_id="d", r_proxy=0.7)
    (reward,) = buf.finalize()
    assert reward.reward == pytest.approx(0.6) and not reward.triggered
    assert len(buf) == 0 and buf.finalize() == []
    assert buf.on_trigger("u", "f", 1.0) == UNTRACKED  # the reward already went into an update
    assert buf.stats["triggers_untracked"] == 1 and buf.stats["finalized_untriggered"] == 1


def test_untriggered_defer_waits_for_trigger_close_or_force():
    buf = PendingRewardBuffer(RewardConfig(untriggered="defer"))
    for i, user in enumerate(("alice", "alice", "bob", "carol")):
        buf.add(fragment_id=f"f{i}", user_id=user, decision_id=f"d{i}", r_proxy=0.4)
    assert buf.finalize() == []
    assert buf.waiting_decisions("alice") == ["d0", "d1"]
    buf.on_trigger("alice", "f1", 1.0)
    assert [r.decision_id for r in buf.finalize()] == ["d1"]  # triggered: due now
    out = buf.finalize(closed_users={"bob"})  # bob's episode ended: his untriggered save resolves to r_proxy
    assert [(r.decision_id, r.triggered) for r in out] == [("d2", False)]
    assert out[0].reward == pytest.approx(0.4)
    assert buf.waiting_decisions() == ["d0", "d3"]
    assert sorted(r.decision_id for r in buf.finalize(force=True)) == ["d0", "d3"]
    assert len(buf) == 0


def test_state_dict_round_trips_through_json_mid_flight():
    cfg = RewardConfig(multi_trigger="mean", untriggered="defer")
    buf = PendingRewardBuffer(cfg)
    buf.add(fragment_id="f1", user_id="u", decision_id="d1", r_proxy=0.25, created_ref=("ep", 1, 3))
    buf.add(fragment_id="f2", user_id="v", decision_id="d2", r_proxy=0.5)
    buf.on_trigger("u", "f1", 0.5, turn_ref=("ep", 2, 1))
    buf.on_trigger("u", "f1", 1.0, turn_ref=("ep", 3, 0))
    buf.on_trigger("u", "missing", 1.0)
    state = json.loads(json.dumps(buf.state_dict(), allow_nan=False))
    restored = PendingRewardBuffer.from_state_dict(state, cfg)
    assert restored.state_dict() == buf.state_dict()
    assert restored.stats == buf.stats
    assert restored.state_dict()["entries"][0]["triggers"] == [[0.5, ["ep", 2, 1]], [1.0, ["ep", 3, 0]]]
    assert buf.finalize(force=True) == restored.finalize(force=True)


def test_from_state_dict_names_the_bad_entry():
    buf = PendingRewardBuffer()
    buf.add(fragment_id="f1", user_id="u", decision_id="d1", r_proxy=0.25)
    buf.on_trigger("u", "f1", 0.5)
    state = buf.state_dict()
    bad = json.loads(json.dumps(state))
    bad["entries"][0]["triggers"][0][0] = None
    with pytest.raises(ValueError, match="entry 0.*trigger 0"):
        PendingRewardBuffer.from_state_dict(bad)
    bad = json.loads(json.dumps(state))
    del bad["entries"][0]["user_id"]
    with pytest.raises(ValueError, match="entry 0: missing field 'user_id'"):
        PendingRewardBuffer.from_state_dict(bad)
    bad = json.loads(json.dumps(state))
    bad["entries"][0]["status"] = "pending"
    with pytest.raises(ValueError, match="status"):
        PendingRewardBuffer.from_state_dict(bad)
    with pytest.raises(ValueError, match="version"):
        PendingRewardBuffer.from_state_dict({**state, "version": 99})


def test_rejects_duplicates_and_non_finite_scores():
    buf = PendingRewardBuffer()
    buf.add(fragment_id="f", user_id="u", decision_id="d", r_proxy=0.5)
    with pytest.raises(ValueError, match="already pending"):
        buf.add(fragment_id="f", user_id="u", decision_id="d2", r_proxy=0.5)
    with pytest.raises(ValueError, match="decision 'd'"):
        buf.add(fragment_id="g", user_id="u", decision_id="d", r_proxy=0.5)
    with pytest.raises(ValueError, match="r_proxy"):
        buf.add(fragment_id="g", user_id="u", decision_id="d2", r_proxy=float("nan"))
    with pytest.raises(ValueError, match="r_qual"):
        buf.on_trigger("u", "f", float("inf"))
    with pytest.raises(ValueError, match="turn_ref"):
        buf.on_trigger("u", "f", 0.5, turn_ref=object())
    assert buf.status("f") == "pending" and len(buf) == 1


# ----------------------------------------------------------------------------- property test
USERS = ("alice", "bob", "carol")
SCORES = st.floats(0.0, 1.0, allow_nan=False, width=32)


class BufferMachine(RuleBasedStateMachine):
    """Random adds / triggers / finalizes / checkpoint restores against a plain-Python model of the buffer."""

    @initialize(
        untriggered=st.sampled_from(("proxy", "defer")),
        multi=st.sampled_from(("first", "max", "mean")),
        cost=st.sampled_from((0.0, 0.05)),
    )
    def setup(self, untriggered, multi, cost):
        self.cfg = RewardConfig(untriggered=untriggered, multi_trigger=multi, save_cost=cost, user_mismatch="count")
        self.buf = PendingRewardBuffer(self.cfg)
        self.model = {}  # fragment_id -> [user, decision_id, r_proxy, [qualities]]
        self.emitted = set()
        self.n = 0

    @rule(user=st.sampled_from(USERS), r_proxy=SCORES)
    def add(self, user, r_proxy):
        fid, did = f"f{self.n}", f"d{self.n}"
        self.n += 1
        self.buf.add(fragment_id=fid, user_id=user, decision_id=did, r_proxy=r_proxy)
        self.model[fid] = [user, did, r_proxy, []]

    @precondition(lambda self: self.n > 0)
    @rule(user=st.sampled_from(USERS), idx=st.integers(0, 10**6), r_qual=SCORES)
    def trigger(self, user, idx, r_qual):
        fid = f"f{idx % (self.n + 1)}"  # sometimes finalized or never-added fragments
        got = self.buf.on_trigger(user, fid, r_qual)
        if fid not in self.model:
            want = UNTRACKED
        elif self.model[fid][0] != user:
            want = USER_MISMATCH
        elif self.model[fid][3] and self.cfg.multi_trigger == "first":
            want = REPEAT
        else:
            want = ASSIGNED
            self.model[fid][3].append(r_qual)
        assert got == want

    @rule(closed=st.sets(st.sampled_from(USERS)), force=st.booleans())
    def finalize(self, closed, force):
        out = self.buf.finalize(closed, force=force)
        due = {
            fid
            for fid, (user, _, _, quals) in self.model.items()
            if quals or self.cfg.untriggered == "proxy" or force or user in closed
        }
        assert {r.fragment_id for r in out} == due
        for r in out:
            user, did, r_proxy, quals = self.model.pop(r.fragment_id)
            assert (r.decision_id, r.user_id) == (did, user)
            assert did not in self.emitted
            self.emitted.add(did)
            agg = {"first": lambda q: q[0], "max": max, "mean": np.mean}[self.cfg.multi_trigger]
            want = r_proxy - self.cfg.save_cost + (self.cfg.truth_lambda * agg(quals) if quals else 0.0)
            assert r.reward == pytest.approx(want, abs=1e-6)
            assert r.triggered == bool(quals) and r.num_triggers == len(quals)

    @rule()
    def restore_from_checkpoint(self):
        state = json.loads(json.dumps(self.buf.state_dict(), allow_nan=False))
        self.buf = PendingRewardBuffer.from_state_dict(state, self.cfg)

    @invariant()
    def matches_model(self):
        if not hasattr(self, "buf"):
            return
        assert len(self.buf) == len(self.model)
        for fid, (_, _, _, quals) in self.model.items():
            assert self.buf.status(fid) == ("triggered" if quals else "pending")


BufferMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestPendingBufferMachine = BufferMachine.TestCase

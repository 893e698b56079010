"""Property test: under any interleaving of many users' operations, no call returns another user's fragments."""

from __future__ import annotations

import io
import re

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, multiple, rule

from icml_jax.memory import MemoryStore, MemoryStoreError, NewFragment, fragment_id_for

USERS = [f"user-{i}" for i in range(6)] + ["", "x"]  # "" is rejected; the rest are distinct users
REAL_USERS = [u for u in USERS if u]
WORDS = ["dog", "Max", "nurse", "Rome", "violin", "peanuts", "sister", "job", "café", "東京"]


class IsolationMachine(RuleBasedStateMachine):
    """Random appends / deletes / reads / exports by many users against a model of who owns what."""

    ids = Bundle("ids")

    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore()
        self.model: dict[str, dict[str, str]] = {u: {} for u in REAL_USERS}  # user -> {fragment_id: text}

    def teardown(self) -> None:
        self.store.close()

    @rule(
        target=ids,
        user=st.sampled_from(REAL_USERS),
        episode=st.sampled_from(["e1", "e2"]),
        turn=st.integers(0, 5),
        words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=4),
    )
    def append(self, user, episode, turn, words):
        text = " ".join(words)
        held = self.model[user].get(fragment_id_for(user, episode, 0, turn))
        if held is not None and held != text:  # another source turn under a stored id: refused, nothing written
            with pytest.raises(MemoryStoreError, match=re.escape(f"user {user!r} already has memory")):
                self.store.append(user, NewFragment(episode, 0, turn, text, text, "v0"))
            return multiple()
        frag = self.store.append(user, NewFragment(episode, 0, turn, text, text, "v0"))
        assert frag.user_id == user
        self.model[user].setdefault(frag.fragment_id, frag.text)
        assert frag.text == self.model[user][frag.fragment_id]  # a replayed turn keeps the first fragment
        return (user, frag.fragment_id)

    @rule(owned=ids, reader=st.sampled_from(REAL_USERS))
    def get(self, owned, reader):
        owner, fid = owned
        got = self.store.get(reader, fid)
        if reader == owner and fid in self.model[owner]:
            assert got is not None and got.user_id == owner
        else:
            assert got is None

    @rule(owned=consumes(ids), actor=st.sampled_from(REAL_USERS))
    def delete(self, owned, actor):
        owner, fid = owned
        removed = self.store.delete(actor, fid)
        if actor == owner:
            assert removed == (fid in self.model[owner])
            self.model[owner].pop(fid, None)
        else:
            assert removed is False  # another user's id cannot be deleted (nor told apart from a missing one)

    @rule(user=st.sampled_from(REAL_USERS), query=st.lists(st.sampled_from(WORDS), max_size=3), k=st.integers(0, 4))
    def top_k(self, user, query, k):
        got = self.store.top_k(user, " ".join(query), k)
        assert len(got) == min(k, len(self.model[user]))
        assert all(f.user_id == user and f.fragment_id in self.model[user] for f in got)

    @rule(user=st.sampled_from(REAL_USERS))
    def export(self, user):
        buf = io.StringIO()
        n = self.store.export_jsonl(user, buf)
        assert n == len(self.model[user])
        assert all(f'"user_id": "{user}"' in line for line in buf.getvalue().splitlines())

    @rule(user=st.sampled_from(REAL_USERS))
    def forget_user(self, user):
        assert self.store.delete_user(user) == len(self.model[user])
        self.model[user].clear()

    @rule()
    def bad_user_is_refused(self):
        try:
            self.store.fragments("")
        except ValueError:
            return
        raise AssertionError("empty user id was accepted")

    @invariant()
    def every_listing_is_exactly_the_users_own(self):
        for user in REAL_USERS:
            frags = self.store.fragments(user)
            assert all(f.user_id == user for f in frags)
            assert {f.fragment_id: f.text for f in frags} == self.model[user]
            assert self.store.count(user) == len(self.model[user])


IsolationMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_memory_isolation = IsolationMachine.TestCase

"""Property test of the Mem0-shaped API: random add / update / delete / delete_all / get / get_all / search /
history calls interleaved across three users never return or change another user's memory (checked against a
model of who owns what)."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, multiple, rule

from icml_jax.memory_api import Memory

USERS = ["alice", "bob", "carol"]
WORDS = ["dog", "Paris", "nurse", "violin", "peanuts", "café", "東京"]
phrases = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join)
messages = st.lists(st.tuples(st.sampled_from(["user", "assistant"]), phrases), min_size=1, max_size=3)


class ApiMachine(RuleBasedStateMachine):
    ids = Bundle("ids")  # (owner, id); kept after deletion, so deleted ids are tried again too

    def __init__(self) -> None:
        super().__init__()
        self.mem = Memory(":memory:")
        self.model: dict[str, dict[str, str]] = {u: {} for u in USERS}  # user -> {id: text}

    def teardown(self) -> None:
        self.mem.close()

    def _own(self, user: str, items: list[dict]) -> None:
        """Every memory a call returns for `user` is one of `user`'s, with the text the model holds."""
        for item in items:
            assert item["user_id"] == user and self.model[user].get(item["id"]) == item["memory"], item

    @rule(target=ids, user=st.sampled_from(USERS), msgs=messages)
    def add(self, user, msgs):
        out = self.mem.add([{"role": r, "content": c} for r, c in msgs], user_id=user)["results"]
        assert [r["memory"] for r in out] == [c for r, c in msgs if r == "user"]
        for item in out:
            assert item["event"] == "ADD" and all(item["id"] not in self.model[u] for u in USERS)
            self.model[user][item["id"]] = item["memory"]
        return multiple(*[(user, item["id"]) for item in out])

    @rule(owned=ids, actor=st.sampled_from(USERS), text=phrases)
    def update(self, owned, actor, text):
        owner, mid = owned
        got = self.mem.update(mid, text, user_id=actor)
        if actor == owner and mid in self.model[owner]:
            self.model[owner][mid] = text
            self._own(actor, [got])
        else:
            assert got is None

    @rule(owned=ids, actor=st.sampled_from(USERS))
    def delete(self, owned, actor):
        owner, mid = owned
        mine = actor == owner and mid in self.model[owner]
        assert self.mem.delete(mid, user_id=actor) is mine
        if mine:
            del self.model[owner][mid]

    @rule(user=st.sampled_from(USERS))
    def delete_all(self, user):
        assert self.mem.delete_all(user) == len(self.model[user])
        self.model[user].clear()

    @rule(owned=ids, reader=st.sampled_from(USERS))
    def get_and_history(self, owned, reader):
        owner, mid = owned
        got, history = self.mem.get(mid, user_id=reader), self.mem.history(mid, user_id=reader)
        if reader == owner and mid in self.model[owner]:
            self._own(reader, [got])
            assert history[0]["event"] == "ADD" and history[-1]["new_memory"] == self.model[owner][mid]
            assert all(h["id"] == mid for h in history)
        else:
            assert got is None and history == []

    @rule(user=st.sampled_from(USERS), query=phrases, limit=st.integers(0, 4))
    def search(self, user, query, limit):
        hits = self.mem.search(query, user_id=user, limit=limit)["results"]
        assert len(hits) == min(limit, len(self.model[user]))
        self._own(user, hits)

    @invariant()
    def get_all_is_exactly_the_users_own(self):
        for user in USERS:
            items = self.mem.get_all(user)["results"]
            self._own(user, items)
            assert len(items) == len(self.model[user])


ApiMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_api_isolation = ApiMachine.TestCase

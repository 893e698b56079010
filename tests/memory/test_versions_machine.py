"""Property test: random appends, updates, supersedes, deletes and exports by three users against a model of
each fragment's text, version and event kinds; no call reads or changes another user's fragments or events."""

from __future__ import annotations

import dataclasses
import io

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, multiple, rule

from icml_jax.memory import MemoryStore, NewFragment, fragment_id_for

USERS = ["alice", "bob", "carol"]
WORDS = ["Paris", "Berlin", "dog", "cat", "nurse", "violin", "東京"]


@dataclasses.dataclass
class Held:
    """What the model knows of one fragment."""

    text: str
    superseded_by: str | None = None
    events: list[str] = dataclasses.field(default_factory=lambda: ["add"])


class VersionsMachine(RuleBasedStateMachine):
    ids = Bundle("ids")

    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore()
        self.model: dict[str, dict[str, Held]] = {u: {} for u in USERS}
        self.order: dict[str, list[tuple[str, str]]] = {u: [] for u in USERS}  # (fragment, event) as they happen

    def teardown(self) -> None:
        self.store.close()

    def _event(self, user: str, fid: str, kind: str) -> None:
        self.model[user][fid].events.append(kind)
        self.order[user].append((fid, kind))

    @rule(target=ids, user=st.sampled_from(USERS), turn=st.integers(0, 6), word=st.sampled_from(WORDS))
    def append(self, user, turn, word):
        fid = fragment_id_for(user, "e", 0, turn)
        if fid in self.model[user]:
            return multiple()  # a replay; covered by the isolation machine
        frag = self.store.append(user, NewFragment("e", 0, turn, f"turn {turn}", word, "v"))
        self.model[user][fid] = Held(word)
        self.order[user].append((fid, "add"))
        return (user, frag.fragment_id)

    @rule(owned=ids, actor=st.sampled_from(USERS), word=st.sampled_from(WORDS))
    def update(self, owned, actor, word):
        owner, fid = owned
        got = self.store.update(actor, fid, word, by="t")
        held = self.model[actor].get(fid) if actor == owner else None
        if held is None:
            assert got is None
            return
        assert got is not None and got.user_id == actor and got.text == word
        if held.text != word:
            held.text = word
            self._event(actor, fid, "update")

    @rule(olds=st.lists(ids, max_size=3), newer=ids, actor=st.sampled_from(USERS))
    def supersede(self, olds, newer, actor):
        ids = [fid for _, fid in olds]
        if newer[1] not in self.model[actor]:
            with pytest.raises(ValueError, match="has no memory"):
                self.store.supersede(actor, ids, newer[1])
            return
        expected = [fid for fid in dict.fromkeys(ids) if fid != newer[1] and fid in self.model[actor]
                    and self.model[actor][fid].superseded_by is None]
        assert self.store.supersede(actor, ids, newer[1]) == expected
        for fid in expected:
            self.model[actor][fid].superseded_by = newer[1]
            self._event(actor, fid, "supersede")

    @rule(owned=consumes(ids), actor=st.sampled_from(USERS))
    def delete(self, owned, actor):
        owner, fid = owned
        mine = actor == owner and fid in self.model[owner]
        assert self.store.delete(actor, fid) is mine
        if mine:
            del self.model[owner][fid]
            self.order[owner] = [x for x in self.order[owner] if x[0] != fid]

    @rule(user=st.sampled_from(USERS))
    def delete_user(self, user):
        assert self.store.delete_user(user) == len(self.model[user])
        self.model[user].clear()
        self.order[user].clear()

    @rule(owned=ids, reader=st.sampled_from(USERS))
    def history(self, owned, reader):
        owner, fid = owned
        events = self.store.history(reader, fid)
        held = self.model[owner].get(fid) if reader == owner else None
        assert [e.event for e in events] == (held.events if held else [])
        assert all(e.user_id == reader and e.fragment_id == fid for e in events)
        if held:
            assert events[-1].text == held.text

    @rule(user=st.sampled_from(USERS))
    def export_import(self, user):
        buf = io.StringIO()
        assert self.store.export_jsonl(user, buf) == len(self.model[user])
        with MemoryStore() as other:
            other.import_jsonl(user, io.StringIO(buf.getvalue()))
            assert other.fragments(user) == self.store.fragments(user)
            strip = lambda events: [dataclasses.replace(e, seq=0) for e in events]  # noqa: E731
            assert strip(other.timeline(user)) == strip(self.store.timeline(user))

    @invariant()
    def every_listing_matches_the_model(self):
        for user in USERS:
            frags = self.store.fragments(user)
            assert {f.fragment_id: (f.text, f.superseded_by) for f in frags} == {
                fid: (h.text, h.superseded_by) for fid, h in self.model[user].items()}
            current = {fid for fid, h in self.model[user].items() if h.superseded_by is None}
            assert {f.fragment_id for f in self.store.candidates(user, "Paris dog", 99)} == current
            assert {f.fragment_id for f, _ in self.store.search(user, "Paris")} == current
            assert all(f.valid_to is not None for f in frags if f.superseded_by)
            assert [(e.fragment_id, e.event) for e in self.store.timeline(user)] == self.order[user]


VersionsMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_versions_machine = VersionsMachine.TestCase

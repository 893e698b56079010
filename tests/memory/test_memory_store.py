"""MemoryStore: CRUD, ordering, persistence across reopen, crash safety, export/import, lexical top-k."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import sqlite3
import subprocess
import sys
import textwrap
import threading

import pytest

from icml_jax.llm import LLMResponse, OfflineBackend, TokenUsage
from icml_jax.memory import (
    EXPORT_FORMAT,
    Fragment,
    MemoryStore,
    MemoryStoreError,
    NewFragment,
    TurnToSave,
    bm25_scores,
    fragment_id_for,
    save_turns,
)


def _clock(start: float = 1000.0):
    counter = itertools.count()
    return lambda: start + next(counter)


def _draft(turn: int, text: str = "", *, episode: str = "ep1", session: int = 0, **kw) -> NewFragment:
    text = text or f"note {turn}"
    return NewFragment(episode_id=episode, session=session, turn=turn, source_text=f"src {text}", text=text,
                       policy_version=kw.pop("policy_version", "v1"), **kw)


@pytest.fixture
def store():
    s = MemoryStore(clock=_clock())
    yield s
    s.close()


def test_append_get_list_delete(store):
    a = store.append("alice", _draft(1, "The user has a dog named Max.", decision_id="d1", extra={"r_proxy": 0.9}))
    b, c = store.append_many("alice", [_draft(2), _draft(0, session=1)])
    assert isinstance(a, Fragment) and a.user_id == "alice" and a.created_at == 1000.0
    assert a.ref == ("ep1", 0, 1) and a.decision_id == "d1" and a.extra == {"r_proxy": 0.9}
    assert a.fragment_id == fragment_id_for("alice", "ep1", 0, 1)
    assert store.get("alice", a.fragment_id) == a
    assert store.fragments("alice") == [a, b, c]  # creation order
    assert store.list("alice", session=1) == [c]
    assert store.fragments("alice", episode_id="nope") == []
    assert store.count("alice") == 3
    assert store.delete("alice", b.fragment_id) is True
    assert store.delete("alice", b.fragment_id) is False
    assert store.get("alice", b.fragment_id) is None
    assert store.delete_user("alice") == 2 and store.count("alice") == 0


def test_same_source_turn_is_idempotent(store):
    first = store.append("u", _draft(3, "first note"))
    replayed = dataclasses.replace(_draft(3, "a note condensed differently"), source_text=first.source_text)
    again = store.append("u", replayed)  # a step replayed after a crash: the committed fragment stays
    assert again == first and store.count("u") == 1
    other_user = store.append("v", _draft(3, "first note"))
    assert other_user.fragment_id != first.fragment_id


def test_another_turn_under_a_stored_id_is_refused_not_dropped(store):
    """Two writers in one session give two source turns one id: the second is an error, never silently lost."""
    first = store.append("u", _draft(3, "first note"))
    with pytest.raises(MemoryStoreError) as err:
        store.append_many("u", [_draft(4, "fine"), _draft(3, "another turn")])
    message = str(err.value)
    assert f"memory store {store.path}: user 'u' already has memory {first.fragment_id}" in message
    assert "session 0, turn 3" in message and "open_session" in message
    assert store.fragments("u") == [first]  # all or nothing: turn 4 of the refused batch is not stored either


@pytest.mark.parametrize(
    ("user", "draft", "match"),
    [
        ("", _draft(1), "user_id"),
        ("u", _draft(1, " "), "empty text"),
        ("u", NewFragment("e", "0", 1, "s", "t", "v"), "session must be an int"),
        ("u", NewFragment("e", 0, 1, "s", "t", "v", extra={"x": object()}), "JSON"),
        ("u", NewFragment("", 0, 1, "s", "t", "v"), "episode_id"),
    ],
)
def test_invalid_drafts_are_rejected_and_nothing_written(store, user, draft, match):
    with pytest.raises(ValueError, match=match):
        store.append_many("u" if user == "u" else user, [_draft(9), draft])
    assert store.count("u") == 0


def test_persistence_across_reopen(tmp_path):
    path = tmp_path / "sub" / "memory.db"
    with MemoryStore(path, clock=_clock()) as s:
        written = s.append_many("alice", [_draft(i) for i in range(5)])
        s.append("bob", _draft(1, "bob's"))
        s.delete("alice", written[2].fragment_id)
    with MemoryStore(path) as s:
        assert s.fragments("alice") == [w for i, w in enumerate(written) if i != 2]
        assert [f.text for f in s.fragments("bob")] == ["bob's"]
        s.append("alice", _draft(7))
    with MemoryStore(path) as s:
        assert s.count("alice") == 5 and sorted(s.user_ids()) == ["alice", "bob"]


def test_crash_mid_write_loses_nothing_committed(tmp_path):
    path = tmp_path / "crash.db"
    script = textwrap.dedent(
        f"""
        import os, itertools
        from icml_jax.memory import MemoryStore, NewFragment
        calls = itertools.count()
        def clock():
            n = next(calls)
            if n == 13:  # inside the second batch's transaction, after 3 of its inserts
                os._exit(3)
            return 1000.0 + n
        s = MemoryStore({str(path)!r}, clock=clock)
        d = lambda t: NewFragment("e", 0, t, "src", "note %d" % t, "v1")
        s.append_many("u", [d(t) for t in range(10)])
        s.append_many("u", [d(t) for t in range(10, 20)])
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    raw.close()
    with MemoryStore(path) as s:
        assert [f.turn for f in s.fragments("u")] == list(range(10))  # first batch whole, second batch absent
        s.append("u", _draft(10))
        assert s.count("u") == 11


def test_export_import_roundtrip(tmp_path, store):
    frags = store.append_many("alice", [_draft(i, extra={"k": [i]}) for i in range(4)])
    store.append("bob", _draft(1))
    out = tmp_path / "alice.jsonl"
    assert store.export_jsonl("alice", out) == 4
    lines = out.read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(x)["format"] == EXPORT_FORMAT for x in lines)
    assert all(json.loads(x)["user_id"] == "alice" for x in lines)
    with MemoryStore(tmp_path / "other.db") as other:
        assert other.import_jsonl("alice", out) == 4
        assert other.fragments("alice") == frags  # ids, times, extra: all preserved
        assert other.import_jsonl("alice", out) == 0  # idempotent
        assert other.count("bob") == 0


def test_import_refuses_other_users_and_names_the_line(tmp_path, store):
    store.append_many("alice", [_draft(i) for i in range(3)])
    buf = io.StringIO()
    store.export_jsonl("alice", buf)
    text = buf.getvalue()
    with MemoryStore() as target:
        with pytest.raises(MemoryStoreError, match=r"<stream>:1: record belongs to another user"):
            target.import_jsonl("mallory", io.StringIO(text))
        bad = tmp_path / "bad.jsonl"
        lines = text.splitlines()
        bad.write_text("\n".join(lines[:2] + ["{not json"]) + "\n")
        with pytest.raises(MemoryStoreError, match=r"bad.jsonl:3: invalid JSON"):
            target.import_jsonl("alice", bad)
        tampered = json.loads(lines[1])
        tampered["turn"] = 99
        bad.write_text(lines[0] + "\n" + json.dumps(tampered) + "\n")
        with pytest.raises(MemoryStoreError, match=r":2: fragment_id .* does not match"):
            target.import_jsonl("alice", bad)
        assert target.count("alice") == 0  # all or nothing
        target.import_jsonl("alice", io.StringIO(text))
        changed = json.loads(lines[0])
        changed["text"] = "edited"
        with pytest.raises(MemoryStoreError, match="already exists with different content"):
            target.import_jsonl("alice", io.StringIO(json.dumps(changed) + "\n"))


def test_top_k_lexical_prefilter(store):
    texts = [
        "The user has a dog named Max.",
        "The user works as a nurse in Boston.",
        "The user is allergic to peanuts.",
        "The user's sister lives in Rome.",
        "The user plays violin.",
    ]
    frags = store.append_many("alice", [_draft(i, t) for i, t in enumerate(texts)])
    store.append_many("bob", [_draft(i, "The user has a dog named Max and another dog.") for i in range(20)])
    top = store.top_k("alice", "How is your dog Max doing?", 2)
    assert top[0] == frags[0] and len(top) == 2 and all(f.user_id == "alice" for f in top)
    assert top[1] == frags[4]  # no overlap: ties go to the most recent
    assert store.top_k("alice", "anything", 10) == frags  # under the cap: everything, creation order
    assert store.top_k("alice", "dog", 0) == []
    assert store.top_k("carol", "dog", 3) == []
    assert store.candidates("alice", "How is your dog Max doing?", 2) == [frags[0], frags[4]]  # creation order
    assert store.candidates("alice", "violin", 3)[-1] == frags[4]
    assert store.candidates("alice", "x", 99) == frags


def test_bm25_prefers_rare_terms():
    s = bm25_scores("dog Rome", ["dog dog cat", "sister lives in Rome", "dog park", "dog again"])
    assert s[1] > s[0] > 0 and bm25_scores("", ["a"]) == [0.0]


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "future.db"
    MemoryStore(path).close()
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version=99")
    raw.close()
    with pytest.raises(MemoryStoreError, match=r"future.db: schema version 99 is newer"):
        MemoryStore(path)


def test_not_a_database_is_named(tmp_path):
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(MemoryStoreError, match=r"garbage.db: cannot open"):
        MemoryStore(path)


def test_concurrent_writers_stay_isolated(tmp_path):
    with MemoryStore(tmp_path / "threads.db") as s:
        def work(u: int) -> None:
            for t in range(15):
                s.append(f"user{u}", _draft(t, f"u{u} t{t}"))
                assert all(f.user_id == f"user{u}" for f in s.fragments(f"user{u}"))

        threads = [threading.Thread(target=work, args=(u,)) for u in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=30)
        for u in range(4):
            assert [f.text for f in s.fragments(f"user{u}")] == [f"u{u} t{t}" for t in range(15)]


class _Blank:
    name = "blank"
    usage = TokenUsage()

    def generate(self, requests):
        return [LLMResponse(text="") for _ in requests]

    def close(self):
        pass


def test_save_turns_condenses_and_appends(store):
    turns = [
        TurnToSave("ep", 1, 4, "I just moved to Lisbon.", history=[("Assistant", "How was your week?")], decision_id="p-17",
                   extra={"r_proxy": 0.8}),
        TurnToSave("ep", 1, 6, "My cat is called Pixel."),
    ]
    saved = save_turns(store, OfflineBackend(), "alice", turns, policy_version="planner@3")
    assert [f.text for f in saved] == ["I just moved to Lisbon.", "My cat is called Pixel."]
    assert saved[0].decision_id == "p-17" and saved[0].policy_version == "planner@3"
    assert saved[0].extra == {"r_proxy": 0.8} and saved[1].source_text == "My cat is called Pixel."
    assert store.fragments("alice") == saved
    (fb,) = save_turns(store, _Blank(), "bob", [TurnToSave("ep", 0, 0, "I am a chef.")], policy_version="p")
    assert fb.text == "I am a chef." and fb.extra == {"condense_fallback": True, "note_problem": "is empty"}
    assert save_turns(store, OfflineBackend(), "bob", [], policy_version="p") == []


def test_most_similar_ranks_by_bm25_newest_first_on_ties_and_skips_unrelated():
    from icml_jax.memory import bm25_scores, most_similar

    docs = ["I adopted a dog", "It rains today", "I adopted a dog", "My dog Rex likes walks", "Work was long"]
    scores = bm25_scores("my dog Rex", docs)
    assert most_similar("my dog Rex", docs, 3) == [3, 2, 0]  # Rex first; equal scores: the newer copy first
    assert scores[0] == scores[2] > 0 and scores[1] == scores[4] == 0
    assert most_similar("my dog Rex", docs, 10) == [3, 2, 0]  # unrelated memories are never shown
    assert most_similar("my dog Rex", docs, 0) == [] and most_similar("anything", [], 2) == []

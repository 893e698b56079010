"""Issue 18, store side: versions (update, supersede), the events of every change (history, timeline), the
v2 -> v3 upgrade, export format "/2" (and "/1" still importing), and erasure that leaves no copy on disk."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import sqlite3
from pathlib import Path

import pytest

from icml_jax.memory import EXPORT_FORMAT, SCHEMA_VERSION, MemoryEvent, MemoryStore, MemoryStoreError, NewFragment
from icml_jax.memory import fragment_id_for
from icml_jax.memory.fragment import FRAGMENT_FIELDS
from tests.memory.test_store_sessions import V1_SCHEMA

V2_SESSIONS = """
CREATE TABLE sessions (user_id TEXT NOT NULL, episode_id TEXT NOT NULL, session INTEGER NOT NULL,
                       opened_at REAL NOT NULL, PRIMARY KEY (user_id, episode_id, session));
CREATE INDEX fragments_by_session ON fragments (user_id, episode_id, session);
"""


def _clock(start: float = 1000.0):
    counter = itertools.count()
    return lambda: start + next(counter)


def _draft(turn: int, text: str = "", **kw) -> NewFragment:
    text = text or f"note {turn}"
    return NewFragment("ep", 0, turn, f"src {text}", text, "v1", **kw)


def _kinds(events: list[MemoryEvent]) -> list[tuple[str, str]]:
    return [(e.fragment_id, e.event) for e in events]


def _unnumbered(events: list[MemoryEvent]) -> list[MemoryEvent]:
    """Events without their store-local sequence number (import renumbers them, keeping their order)."""
    return [dataclasses.replace(e, seq=0) for e in events]


@pytest.fixture
def store():
    s = MemoryStore(clock=_clock())
    yield s
    s.close()


def test_fragment_fields_end_with_the_version():
    assert FRAGMENT_FIELDS[-2:] == ("superseded_by", "valid_to") and EXPORT_FORMAT.endswith("/2")


def test_append_records_add_events_by_the_decision_or_the_caller(store):
    a = store.append("alice", _draft(0, decision_id="d0"))
    b, c = store.append_many("alice", [_draft(1, decision_id="d1"), _draft(2)], by="api")
    assert a.current and a.superseded_by is None and a.valid_to is None
    (ev,) = store.history("alice", a.fragment_id)
    assert ev == MemoryEvent(ev.seq, "alice", a.fragment_id, "add", a.created_at, a.text, "d0", {})
    assert [e.by for e in store.timeline("alice")] == ["d0", "api", "api"]
    assert _kinds(store.timeline("alice")) == [(f.fragment_id, "add") for f in (a, b, c)]
    assert store.append("alice", _draft(0, decision_id="d0")) == a  # a replay records nothing
    assert len(store.timeline("alice")) == 3


def test_update_replaces_the_note_and_keeps_the_old_text(store):
    f = store.append("alice", _draft(0, "lives in Paris"))
    g = store.update("alice", f.fragment_id, "lives in Berlin", by="api")
    assert g == dataclasses.replace(f, text="lives in Berlin") and store.get("alice", f.fragment_id) == g
    assert g.source_text == f.source_text  # the provenance stays
    add, upd = store.history("alice", f.fragment_id)
    assert (upd.event, upd.text, upd.by) == ("update", "lives in Berlin", "api")
    assert upd.detail == {"old_text": "lives in Paris"}
    assert upd.at > add.at and upd.seq > add.seq
    assert store.update("alice", f.fragment_id, "lives in Berlin") == g  # same text: no event
    assert len(store.history("alice", f.fragment_id)) == 2
    assert store.update("bob", f.fragment_id, "hijacked") is None  # another user's id looks missing
    assert store.update("alice", "m_nope", "x") is None
    assert store.get("alice", f.fragment_id).text == "lives in Berlin" and store.history("bob", f.fragment_id) == []
    with pytest.raises(ValueError, match=f"new text of '{f.fragment_id}' for 'alice' must be a non-empty"):
        store.update("alice", f.fragment_id, "  ")


def test_supersede_marks_current_fragments_of_the_user_only(store):
    old, older, new = store.append_many("alice", [_draft(0, "lives in Paris"), _draft(1, "lives in Rome"),
                                                  _draft(2, "lives in Berlin")])
    bobs = store.append("bob", _draft(0, "lives in Paris"))
    marked = store.supersede("alice", [old.fragment_id, "m_unknown", bobs.fragment_id, new.fragment_id,
                                       old.fragment_id, older.fragment_id], new.fragment_id, by="p-7")
    assert marked == [old.fragment_id, older.fragment_id]
    got = store.get("alice", old.fragment_id)
    assert got.superseded_by == new.fragment_id and got.valid_to == 1004.0 and not got.current
    assert store.get("bob", bobs.fragment_id).current  # another user's fragment is untouched
    *_, ev = store.history("alice", old.fragment_id)
    assert (ev.event, ev.text, ev.by, ev.detail, ev.at) == ("supersede", "lives in Paris", "p-7",
                                                            {"superseded_by": new.fragment_id}, 1004.0)
    assert store.supersede("alice", [old.fragment_id], new.fragment_id) == []  # already superseded
    assert store.fragments("alice", current_only=True) == [new]
    assert [f.fragment_id for f in store.fragments("alice")] == [old.fragment_id, older.fragment_id, new.fragment_id]
    assert store.count("alice") == 3 and store.count("alice", current_only=True) == 1
    with pytest.raises(ValueError, match=r"user 'alice' has no memory 'm_x' to supersede with"):
        store.supersede("alice", [new.fragment_id], "m_x")
    with pytest.raises(ValueError, match="has no memory"):
        store.supersede("bob", [bobs.fragment_id], new.fragment_id)  # alice's fragment is not bob's
    with pytest.raises(TypeError, match="sequence of ids"):
        store.supersede("alice", new.fragment_id, new.fragment_id)
    assert store.get("bob", bobs.fragment_id).current


def test_the_trigger_is_offered_current_fragments_only(store):
    paris, dog, berlin = store.append_many("alice", [_draft(0, "The user lives in Paris."),
                                                     _draft(1, "The user has a dog."),
                                                     _draft(2, "The user lives in Berlin.")])
    store.supersede("alice", [paris.fragment_id], berlin.fragment_id)
    assert store.candidates("alice", "Where do I live? Paris?", 5) == [dog, berlin]
    assert store.top_k("alice", "Paris", 1) == [berlin]  # ties: the most recent
    assert store.top_k("alice", "anything", 5) == [dog, berlin]
    hits = store.search("alice", "my dog")
    assert [f for f, _ in hits] == [dog, berlin] and hits[0][1] > 0 and hits[1][1] == 0.0
    assert store.search("alice", "my dog", 1) == hits[:1] and store.search("alice", "dog", 0) == []
    assert store.search("bob", "dog") == []


def test_timeline_orders_every_change_of_the_user(store):
    a, b = store.append_many("alice", [_draft(0), _draft(1)])
    store.append("bob", _draft(0))
    store.update("alice", a.fragment_id, "changed")
    store.supersede("alice", [a.fragment_id], b.fragment_id)
    assert _kinds(store.timeline("alice")) == [(a.fragment_id, "add"), (b.fragment_id, "add"),
                                               (a.fragment_id, "update"), (a.fragment_id, "supersede")]
    assert [e.text for e in store.history("alice", a.fragment_id)] == ["note 0", "changed", "changed"]
    assert all(e.user_id == "bob" for e in store.timeline("bob")) and store.timeline("carol") == []


def test_delete_removes_events_and_leaves_what_it_superseded_superseded(store):
    old, new = store.append_many("alice", [_draft(0), _draft(1)])
    store.supersede("alice", [old.fragment_id], new.fragment_id)
    assert store.delete("bob", new.fragment_id) is False and len(store.history("alice", new.fragment_id)) == 1
    assert store.delete("alice", new.fragment_id) is True
    assert store.history("alice", new.fragment_id) == [] and store.get("alice", old.fragment_id).superseded_by
    assert _kinds(store.timeline("alice")) == [(old.fragment_id, "add"), (old.fragment_id, "supersede")]
    assert store.delete_user("alice") == 1 and store.timeline("alice") == []


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.parent.glob(path.name + "*"))}


def test_erased_text_leaves_no_copy_in_any_database_file(tmp_path):
    """A canary written, updated, superseded and then erased is in none of .sqlite, -wal, -shm: while the store
    is open (secure_delete zeroes it in the database, the truncated WAL holds nothing) and after closing it."""
    path = tmp_path / "memory.sqlite"
    canary, canary2 = "CANARY-4b1d-the-user-whispered", "CANARY-9e77-bob-whispered"
    with MemoryStore(path) as s:
        keep = s.append("alice", _draft(0, "The user keeps a cat."))
        secret = s.append("alice", NewFragment("ep", 0, 1, f"I told you {canary}", f"note {canary}", "v1"))
        s.update("alice", secret.fragment_id, f"note {canary} updated")  # the old text goes into an event
        s.supersede("alice", [secret.fragment_id], keep.fragment_id)
        s.append_many("bob", [NewFragment("ep", 0, t, f"{canary2} {t}", f"{canary2} note {t}", "v1")
                              for t in range(40)])  # a few pages' worth
        s.open_session("bob", "chat")
        before = b"".join(_files(path).values())
        assert canary.encode() in before and canary2.encode() in before  # the check below could fail
        assert s.delete("alice", secret.fragment_id) and s.delete_user("bob") == 40
        for name, data in _files(path).items():
            assert canary.encode() not in data and canary2.encode() not in data, name
        assert s.fragments("alice") == [keep] and s.timeline("bob") == []
    assert {p.name for p in tmp_path.iterdir()} >= {"memory.sqlite"}
    for name, data in _files(path).items():
        assert canary.encode() not in data and canary2.encode() not in data, name
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT COUNT(*) FROM sessions WHERE user_id = 'bob'").fetchone() == (0,)
    assert raw.execute("SELECT COUNT(*) FROM events WHERE user_id = 'bob'").fetchone() == (0,)
    raw.close()


def test_a_reader_holding_the_wal_back_is_warned_about(tmp_path, caplog):
    path = tmp_path / "memory.sqlite"
    with MemoryStore(path, timeout_s=0.2) as s:
        f = s.append("alice", _draft(0, "CANARY-held"))
        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM fragments").fetchone()  # a read transaction pins the WAL
        try:
            with caplog.at_level("WARNING", logger="icml_jax.memory.store"):
                assert s.delete("alice", f.fragment_id)
        finally:
            reader.close()
        assert f"{path}: delete of {f.fragment_id} for 'alice' is committed, but its WAL could not be" in caplog.text
        assert s.delete_user("alice") == 0  # the next erasure truncates it
        assert all(b"CANARY-held" not in data for data in _files(path).values())


def _v2_database(path: Path, *, with_column: bool = False) -> list[tuple]:
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA journal_mode=WAL")
    raw.executescript(V1_SCHEMA + V2_SESSIONS)
    if with_column:  # a half-done upgrade by hand: adding the column again must not fail
        raw.execute("ALTER TABLE fragments ADD COLUMN superseded_by TEXT")
    rows = [(fragment_id_for("alice", "chat", s, 0), "alice", "chat", s, 0, f"fact {s}", f"note {s}", 100.0 + s,
             "p1", f"d{s}" if s != 2 else None, "{}") for s in (1, 2, 3)]
    raw.executemany("INSERT INTO fragments (fragment_id, user_id, episode_id, session, turn, source_text, text, "
                    "created_at, policy_version, decision_id, extra) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    raw.execute("INSERT INTO sessions VALUES ('alice', 'chat', 3, 99.0)")
    raw.execute("PRAGMA user_version=2")
    raw.commit()
    raw.close()
    return rows


@pytest.mark.parametrize("with_column", [False, True])
def test_a_version_2_database_is_upgraded_in_place(tmp_path, with_column):
    path = tmp_path / "v2.sqlite"
    rows = _v2_database(path, with_column=with_column)
    with MemoryStore(path, clock=_clock(500.0)) as s:
        frags = s.fragments("alice")
        assert [(f.fragment_id, f.text, f.superseded_by, f.valid_to) for f in frags] == [
            (r[0], r[6], None, None) for r in rows]
        assert [(e.event, e.at, e.text, e.by) for e in s.timeline("alice")] == [
            ("add", r[7], r[6], r[9]) for r in rows]  # derived from the rows: their text never changed
        assert s.open_session("alice", "chat") == 4
        s.supersede("alice", [frags[0].fragment_id], frags[2].fragment_id)
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) and SCHEMA_VERSION == 3
    raw.close()
    with MemoryStore(path) as s:  # reopening changes nothing
        assert len(s.timeline("alice")) == 4 and s.count("alice", current_only=True) == 2


def test_export_import_carries_versions_and_events_in_order(tmp_path):
    with MemoryStore(clock=lambda: 7.0) as a:  # one time for everything: only the order tells events apart
        f0, f1, f2 = a.append_many("alice", [_draft(0), _draft(1, decision_id="d1"), _draft(2)])
        a.update("alice", f0.fragment_id, "edited", by="api")
        a.supersede("alice", [f1.fragment_id], f2.fragment_id, by="p")
        a.update("alice", f1.fragment_id, "edited again")
        a.append("bob", _draft(0))
        out = tmp_path / "alice.jsonl"
        assert a.export_jsonl("alice", out) == 3
        records = [json.loads(x) for x in out.read_text().splitlines()]
        assert {r["format"] for r in records} == {EXPORT_FORMAT}
        assert [e["event"] for e in records[1]["events"]] == ["add", "supersede", "update"]
        with MemoryStore() as b:
            b.append("alice", _draft(9))  # events already there come first; imported ones keep their order
            assert b.import_jsonl("alice", out) == 3
            assert [f for f in b.fragments("alice") if f.turn != 9] == a.fragments("alice")
            assert _unnumbered(b.timeline("alice"))[1:] == _unnumbered(a.timeline("alice"))
            assert b.import_jsonl("alice", out) == 0 and len(b.timeline("alice")) == 7  # idempotent
            changed = dict(records[1], superseded_by=None, valid_to=None)
            with pytest.raises(MemoryStoreError, match="already exists with different content"):
                b.import_jsonl("alice", io.StringIO(json.dumps(changed)))


def test_records_of_format_1_still_import(store):
    f = store.append("alice", _draft(0, decision_id="d0"))
    record = {k: v for k, v in f.to_json().items() if k not in ("superseded_by", "valid_to")}
    line = json.dumps({"format": "icml_jax.memory.fragment/1", **record})
    with MemoryStore() as other:
        assert other.import_jsonl("alice", io.StringIO(line + "\n")) == 1
        assert other.fragments("alice") == [f]
        (ev,) = other.history("alice", f.fragment_id)
        assert (ev.event, ev.at, ev.text, ev.by, ev.detail) == ("add", f.created_at, f.text, "d0", {})


@pytest.mark.parametrize(("change", "match"), [
    (lambda r: r.pop("events"), r":1: missing field\(s\) \['events'\]"),
    (lambda r: r.pop("valid_to"), r":1: missing field\(s\) \['valid_to'\]"),
    (lambda r: r.update(events={}), ":1: memory fragment: events must be a list"),
    (lambda r: r["events"][0].update(event="rename"), r":1: memory fragment: event 0: event must be one of"),
    (lambda r: r["events"][0].pop("at"), r":1: memory fragment: event 0: missing field\(s\) \['at'\]"),
    (lambda r: r["events"][0].update(seq="1"), "event 0: seq must be an int"),
    (lambda r: r["events"][0].update(detail=[]), "event 0: detail must be a JSON object"),
    (lambda r: r["events"][0].update(by=3), "event 0: text must be a string and by a string or null"),
    (lambda r: r.update(superseded_by="m_x"), "superseded_by .* and valid_to .* go together"),
    (lambda r: r.update(valid_to=True, superseded_by="m_x"), "go together"),
    (lambda r: r.update(format="icml_jax.memory.fragment/9"), "not a fragment record of format"),
])
def test_malformed_records_name_the_source_line_and_import_nothing(store, change, match):
    store.append("alice", _draft(0))
    buf = io.StringIO()
    store.export_jsonl("alice", buf)
    record = json.loads(buf.getvalue())
    change(record)
    with MemoryStore() as other:
        with pytest.raises(MemoryStoreError, match=match):
            other.import_jsonl("alice", io.StringIO(json.dumps(record) + "\n"))
        assert other.count("alice") == 0 and other.timeline("alice") == []

"""Session numbers allocated by the store, the v1 -> v2 schema upgrade, and many processes on one database file.

Issue 16: two chats of one user both took "session 1" (1 + the highest stored session), so their memories got the
same ids and the second chat's were dropped; concurrent openers of a new file could fail with "database is locked".
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from icml_jax.memory import SCHEMA_VERSION, MemoryStore, MemoryStoreError, NewFragment, fragment_id_for
from tests.memory import store_workers

# The schema of version 1, verbatim: the database a store written before sessions were recorded holds.
V1_SCHEMA = """
CREATE TABLE fragments (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    fragment_id    TEXT    NOT NULL UNIQUE,
    user_id        TEXT    NOT NULL,
    episode_id     TEXT    NOT NULL,
    session        INTEGER NOT NULL,
    turn           INTEGER NOT NULL,
    source_text    TEXT    NOT NULL,
    text           TEXT    NOT NULL,
    created_at     REAL    NOT NULL,
    policy_version TEXT    NOT NULL,
    decision_id    TEXT,
    extra          TEXT    NOT NULL DEFAULT '{}'
);
CREATE INDEX fragments_by_user ON fragments (user_id, created_at, seq);
"""


def _turn(session: int, turn: int, text: str = "", episode: str = "chat") -> NewFragment:
    text = text or f"s{session} t{turn}"
    return NewFragment(episode, session, turn, text, text, "v1")


def _rows(path: Path, sql: str, *params: object) -> list[tuple]:
    raw = sqlite3.connect(path)
    try:
        return raw.execute(sql, params).fetchall()
    finally:
        raw.close()


def test_open_session_counts_past_recorded_and_stored_sessions(tmp_path):
    with MemoryStore(tmp_path / "m.db") as store:
        assert [store.open_session("alice", "chat") for _ in range(3)] == [1, 2, 3]
        assert store.open_session("bob", "chat") == 1 and store.open_session("alice", "other") == 1
        store.append("alice", _turn(7, 0))  # e.g. imported, or written by an older version without a record
        assert store.open_session("alice", "chat") == 8
        store.append("carol", _turn(-2, 0))
        assert store.open_session("carol", "chat") == 1  # numbers start at 1
        with pytest.raises(ValueError, match="episode_id must be a non-empty string"):
            store.open_session("alice", "")
        with pytest.raises(ValueError, match="user_id"):
            store.open_session("", "chat")


def test_delete_user_erases_session_records_too(tmp_path):
    path = tmp_path / "m.db"
    with MemoryStore(path) as store:
        for user in ("alice", "bob"):
            store.open_session(user, "chat")
            store.append(user, _turn(1, 0))
            store.open_session(user, "chat")
        assert store.delete_user("alice") == 1
        assert store.open_session("bob", "chat") == 3
    assert _rows(path, "SELECT COUNT(*) FROM sessions WHERE user_id = 'alice'") == [(0,)]
    assert _rows(path, "SELECT COUNT(*) FROM fragments WHERE user_id = 'alice'") == [(0,)]
    assert _rows(path, "SELECT session FROM sessions WHERE user_id = 'bob' ORDER BY session") == [(1,), (2,), (3,)]
    with MemoryStore(path) as store:
        assert store.open_session("alice", "chat") == 1  # nothing of alice is left to count from


def test_session_count_counts_a_users_recorded_sessions_only(tmp_path):
    """Issue 31: erasure counts the session records it removes (a chat that saved nothing leaves one)."""
    with MemoryStore(tmp_path / "m.db") as store:
        assert store.session_count("alice") == 0
        store.open_session("alice", "chat"), store.open_session("alice", "api"), store.open_session("bob", "chat")
        assert (store.session_count("alice"), store.session_count("bob")) == (2, 1)
        store.delete_user("alice")
        assert (store.session_count("alice"), store.session_count("bob")) == (0, 1)


def test_a_version_1_database_opens_keeps_its_rows_and_gets_sessions(tmp_path):
    path = tmp_path / "v1.db"
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA journal_mode=WAL")
    raw.executescript(V1_SCHEMA)
    rows = [(fragment_id_for("alice", "chat", s, 0), "alice", "chat", s, 0, f"fact {s}", f"note {s}", 100.0 + s,
             "p1", None, '{"speaker": "user"}') for s in (1, 2, 3)]
    raw.executemany("INSERT INTO fragments (fragment_id, user_id, episode_id, session, turn, source_text, text, "
                    "created_at, policy_version, decision_id, extra) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    raw.execute("PRAGMA user_version=1")
    raw.commit()
    raw.close()

    with MemoryStore(path) as store:
        frags = store.fragments("alice")
        assert [(f.fragment_id, f.session, f.text, f.extra) for f in frags] == [
            (r[0], r[3], r[6], {"speaker": "user"}) for r in rows]
        assert store.open_session("alice", "chat") == 4
        store.append("alice", _turn(4, 0))
    assert _rows(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)] and SCHEMA_VERSION == 3
    with MemoryStore(path) as store:  # reopening an upgraded database changes nothing
        assert store.count("alice") == 4 and store.open_session("alice", "chat") == 5


def test_open_waits_for_a_writer_in_rollback_journal_mode(tmp_path):
    """Switching to WAL needs the lock another opener may hold (SQLite answers BUSY at once, no busy timeout):
    the store retries within its timeout instead of failing with "database is locked"."""
    path = tmp_path / "new.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE other (x)")
    holder.execute("BEGIN IMMEDIATE")  # a writer that has not switched the new file to WAL yet
    release = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
    release.start()
    start = time.monotonic()
    try:
        with MemoryStore(path, timeout_s=10) as store:
            assert store.open_session("alice", "chat") == 1
    finally:
        release.join()
        holder.close()
    assert 0.25 < time.monotonic() - start < 5
    assert _rows(path, "PRAGMA journal_mode") == [("wal",)]


def test_open_gives_up_after_its_timeout_naming_the_file(tmp_path):
    path = tmp_path / "held.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE other (x)")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(MemoryStoreError, match=r"held.db: cannot open \(database is locked\)"):
            MemoryStore(path, timeout_s=0.2)
    finally:
        holder.close()


def test_concurrent_processes_on_one_new_file_lose_nothing(tmp_path):
    """4 writers and 2 session openers open one new database at the same moment and write in small transactions:
    no lock error, every row present, every session number distinct."""
    path, writers, rows, sessions = str(tmp_path / "shared.db"), 4, 24, 12
    reports = store_workers.run_processes([(store_workers.append_rows, (path, w, rows)) for w in range(writers)]
                             + [(store_workers.open_sessions, (path, o, sessions)) for o in range(2)])
    allocated = reports["opener0"] + reports["opener1"]
    assert sorted(allocated) == list(range(1, 2 * sessions + 1))  # distinct, and none skipped
    assert all(a < b for a, b in zip(reports["opener0"], reports["opener0"][1:]))
    with MemoryStore(path) as store:
        for w in range(writers):
            got = [f.text for f in store.fragments(f"user{w % 2}", episode_id=f"writer{w}")]
            assert got == [f"w{w} t{t}" for t in range(rows)]
        assert store.count("user0") == store.count("user1") == 2 * rows


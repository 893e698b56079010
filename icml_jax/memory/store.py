"""MemoryStore: per-user memory fragments with provenance, persisted in SQLite.

Isolation is structural: every read, change and delete takes the user id and filters on it in SQL, so no call can
return another user's fragments. Every write runs in one transaction (BEGIN IMMEDIATE ... COMMIT) with
synchronous=FULL, so a crash mid-write loses nothing committed and leaves no partial batch behind.

Fragments are versioned: `update` rewrites a note, `supersede` marks notes made out of date by a newer one
(they stay, with `superseded_by` / `valid_to`, but leave the Trigger's candidates), and every change is an event
(`history`, `timeline`). Erasure is real: `delete` / `delete_user` remove the rows and their events with
secure_delete on, then truncate the WAL, so no copy of an erased note stays in the database files (a warning
says when another connection's read holds the WAL back: a later erasure or the last close clears it).

Several processes may share one database file (WAL, busy timeout): `open_session` hands each writer its own
session number, so the ids of their fragments, derived from (user, episode, session, turn), never collide; an id
already holding another source turn is refused (MemoryStoreError), never silently dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from icml_jax.memory.fragment import (
    EVENT_KINDS,
    FRAGMENT_FIELDS,
    Fragment,
    MemoryEvent,
    NewFragment,
    fragment_id_for,
    validate_new,
)
from icml_jax.memory.lexical import bm25_scores, rank
from icml_jax.textcheck import check_text

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 3
EXPORT_FORMAT = "icml_jax.memory.fragment/2"  # a fragment with its versions and events
_FORMAT_V1 = "icml_jax.memory.fragment/1"  # before versions: still imported (current, one "add" event)
_V1_FIELDS = tuple(f for f in FRAGMENT_FIELDS if f not in ("superseded_by", "valid_to"))

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS fragments (
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
CREATE INDEX IF NOT EXISTS fragments_by_user ON fragments (user_id, created_at, seq);
"""
_SCHEMA_V2 = """
CREATE TABLE IF NOT EXISTS sessions (
    user_id    TEXT    NOT NULL,
    episode_id TEXT    NOT NULL,
    session    INTEGER NOT NULL,
    opened_at  REAL    NOT NULL,
    PRIMARY KEY (user_id, episode_id, session)
);
CREATE INDEX IF NOT EXISTS fragments_by_session ON fragments (user_id, episode_id, session);
"""
# Every change of a fragment; the "add" events of fragments stored before version 3 are derived from their rows
# (their text never changed before then). The column `actor` is MemoryEvent.by ("by" is an SQL keyword).
_SCHEMA_V3 = """
CREATE TABLE IF NOT EXISTS events (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id     TEXT    NOT NULL,
    fragment_id TEXT    NOT NULL,
    event       TEXT    NOT NULL,
    at          REAL    NOT NULL,
    text        TEXT    NOT NULL,
    actor       TEXT,
    detail      TEXT    NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS events_by_fragment ON events (user_id, fragment_id, seq);
INSERT INTO events (user_id, fragment_id, event, at, text, actor, detail)
    SELECT user_id, fragment_id, 'add', created_at, text, decision_id, '{}' FROM fragments AS f
    WHERE NOT EXISTS (SELECT 1 FROM events AS e WHERE e.fragment_id = f.fragment_id)
    ORDER BY created_at, seq
"""
# version -> the DDL that takes a database of the version before it there; every statement is idempotent.
_MIGRATIONS: dict[int, str] = {1: _SCHEMA_V1, 2: _SCHEMA_V2, 3: _SCHEMA_V3}
# version -> (table, column, type) added on the way there, before its DDL (skipped when present: idempotent too)
_ADDED_COLUMNS: dict[int, tuple[tuple[str, str, str], ...]] = {
    3: (("fragments", "superseded_by", "TEXT"), ("fragments", "valid_to", "REAL")),
}
_EVENT_COLUMNS = "seq, user_id, fragment_id, event, at, text, actor, detail"
_WAL_RETRY_S = 0.02  # pause between attempts to switch a new database to WAL while another opener holds it
_COLUMNS = ", ".join(FRAGMENT_FIELDS)
_ORDER = "ORDER BY created_at, seq"
_DRAFT_FIELDS = ("episode_id", "session", "turn", "source_text", "text", "policy_version", "decision_id", "extra")


class MemoryStoreError(RuntimeError):
    """A store operation failed; the message names the store path and what was being done."""


def _row_to_fragment(row: sqlite3.Row | tuple[Any, ...]) -> Fragment:
    d = dict(zip(FRAGMENT_FIELDS, tuple(row), strict=True))
    d["extra"] = json.loads(d["extra"])
    return Fragment(**d)


def _row_to_event(row: sqlite3.Row | tuple[Any, ...]) -> MemoryEvent:
    seq, user_id, fragment_id, event, at, text, actor, detail = tuple(row)
    return MemoryEvent(seq, user_id, fragment_id, event, at, text, actor, json.loads(detail))


def _record_event(event: MemoryEvent) -> dict[str, Any]:
    """An event as an export record carries it (its user and fragment are the record's)."""
    d = event.to_json()
    del d["user_id"], d["fragment_id"]
    return d


def _check_user(user_id: str, op: str) -> None:
    """ValueError unless `user_id` is a non-empty string; TextError (naming MemoryStore.`op`) unless valid text."""
    if not isinstance(user_id, str) or not user_id:
        raise ValueError(f"memory store: user_id must be a non-empty string, got {user_id!r}")
    check_text(user_id, f"MemoryStore.{op}", "user_id")


def _check_id(value: Any, op: str, argument: str = "fragment_id") -> None:
    """TextError (naming MemoryStore.`op` and `argument`) when a string id is not valid text (SQLite cannot bind
    it); other values are left to the query, which matches nothing."""
    if isinstance(value, str):
        check_text(value, f"MemoryStore.{op}", argument)


def _is_busy(exc: sqlite3.Error) -> bool:
    """Whether `exc` is SQLITE_BUSY (another connection holds the lock), extended codes included."""
    return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_BUSY


class MemoryStore:
    """SQLite-backed store of memory fragments, one isolated memory per user; thread-safe."""

    def __init__(
        self,
        path: str | os.PathLike[str] = ":memory:",
        *,
        clock: Callable[[], float] = time.time,
        timeout_s: float = 30.0,
    ) -> None:
        self.path = str(path)
        self._clock = clock
        self._lock = threading.RLock()
        in_memory = self.path == ":memory:" or self.path.startswith("file::memory:")
        if not in_memory:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=timeout_s, isolation_level=None, check_same_thread=False
            )
            if not in_memory:
                self._enable_wal(timeout_s)
            self._conn.execute("PRAGMA synchronous=FULL")
            if self._conn.execute("PRAGMA secure_delete=ON").fetchone()[0] != 1:  # erased text is zeroed on disk
                logger.warning("memory store %s: SQLite refused secure_delete; erased notes may stay on disk",
                               self.path)
            with self._tx("open"):
                self._migrate()
        except (sqlite3.Error, MemoryStoreError) as e:
            conn = getattr(self, "_conn", None)
            if conn is not None:
                conn.close()
            if isinstance(e, MemoryStoreError):
                raise
            raise MemoryStoreError(f"memory store {self.path}: cannot open ({e})") from e

    def __repr__(self) -> str:
        return f"MemoryStore(path={self.path!r})"

    def _enable_wal(self, timeout_s: float) -> None:
        """Switch to WAL, retrying while another process opens the same new file.

        Changing the journal mode while another connection holds a write lock on a database not yet in WAL (e.g.
        a second process creating the same new file) fails with SQLITE_BUSY at once, without the busy timeout,
        so this loop stands in for it.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as e:
                if not _is_busy(e) or time.monotonic() >= deadline:
                    raise
                time.sleep(_WAL_RETRY_S)
        if str(mode).lower() != "wal":  # e.g. a file system without shared memory: still safe, less concurrent
            logger.warning("memory store %s: journal mode is %s, not WAL; writers will wait on each other", self.path,
                           mode)

    def _migrate(self) -> None:
        """Create or upgrade the schema to SCHEMA_VERSION (inside the open transaction); refuse a newer one."""
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise MemoryStoreError(
                f"memory store {self.path}: schema version {version} is newer than this code ({SCHEMA_VERSION})"
            )
        if 0 < version < SCHEMA_VERSION:
            logger.info("memory store %s: upgrading schema %d -> %d", self.path, version, SCHEMA_VERSION)
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for table, column, decl in _ADDED_COLUMNS.get(target, ()):
                present = {r[1] for r in self._conn.execute(f"PRAGMA table_info({table})")}
                if column not in present:
                    self._conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
            for stmt in filter(str.strip, _MIGRATIONS[target].split(";")):
                self._conn.execute(stmt)
        if version != SCHEMA_VERSION:
            self._conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    # -- plumbing ------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _tx(self, op: str) -> Iterator[sqlite3.Connection]:
        """One write transaction: all or nothing; SQLite errors name the store and the operation."""
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                    self._conn.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as e:
                raise MemoryStoreError(f"memory store {self.path}: {op} failed ({e})") from e

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[None]:
        """One read transaction: the reads inside see one state of the database, whatever other writers do."""
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                yield
            finally:
                self._conn.execute("COMMIT")

    def _query(self, sql: str, params: Sequence[Any]) -> list[Fragment]:
        with self._lock:
            return [_row_to_fragment(r) for r in self._conn.execute(sql, params).fetchall()]

    def _events(self, sql: str, params: Sequence[Any]) -> list[MemoryEvent]:
        with self._lock:
            return [_row_to_event(r) for r in self._conn.execute(sql, params).fetchall()]

    @staticmethod
    def _insert_event(conn: sqlite3.Connection, user_id: str, fragment_id: str, event: str, at: float, text: str,
                      by: str | None, detail: Mapping[str, Any]) -> None:
        conn.execute(
            "INSERT INTO events (user_id, fragment_id, event, at, text, actor, detail) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (user_id, fragment_id, event, float(at), text, by, json.dumps(dict(detail), allow_nan=False,
                                                                           sort_keys=True)),
        )

    def _scrub(self, op: str) -> None:
        """After an erasure: move the WAL into the database file and truncate it to zero bytes, so the erased
        text (zeroed in the database by secure_delete) leaves no copy in `-wal` either."""
        try:
            busy = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.Error as e:
            busy, why = 1, str(e)
        else:
            why = "another connection is still reading"
        if busy:
            logger.warning("memory store %s: %s is committed, but its WAL could not be truncated (%s); the erased "
                           "text stays in %s-wal until a later erasure or the last connection closes",
                           self.path, op, why, self.path)

    def close(self) -> None:
        """Close the database (WAL is checkpointed)."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes ------------------------------------------------------------------------------------

    def append(self, user_id: str, draft: NewFragment, *, by: str | None = None) -> Fragment:
        """Store one fragment for `user_id` and return it (see append_many for the id and duplicates)."""
        return self.append_many(user_id, [draft], by=by)[0]

    def append_many(self, user_id: str, drafts: Sequence[NewFragment], *, by: str | None = None) -> list[Fragment]:
        """Store fragments for `user_id` in one transaction, all or nothing; returns the stored fragments, in order.

        Each new fragment gets an "add" event by `by` (default: its draft's decision_id), in the same transaction.

        The id is derived from (user, episode, session, turn), so saving the same source turn twice is
        idempotent: the fragment committed first is kept and returned, even when its note was condensed
        differently (e.g. a step replayed after a crash). An id that holds a different source turn means two
        writers shared a session (see `open_session`): that raises MemoryStoreError and stores nothing.
        """
        _check_user(user_id, "append_many")
        for i, d in enumerate(drafts):
            validate_new(user_id, d, f"MemoryStore.append_many (drafts[{i}])")
        if by is not None:
            check_text(by, "MemoryStore.append_many", "by")
        out: list[Fragment] = []
        with self._tx("append") as conn:
            for d in drafts:
                fid = fragment_id_for(user_id, d.episode_id, d.session, d.turn)
                row = conn.execute(
                    f"SELECT {_COLUMNS} FROM fragments WHERE fragment_id = ? AND user_id = ?", (fid, user_id)
                ).fetchone()
                if row is not None:
                    out.append(self._replayed(_row_to_fragment(row), d))
                    continue
                frag = Fragment(
                    fragment_id=fid,
                    user_id=user_id,
                    episode_id=d.episode_id,
                    session=d.session,
                    turn=d.turn,
                    source_text=d.source_text,
                    text=d.text,
                    created_at=float(self._clock()),
                    policy_version=d.policy_version,
                    decision_id=d.decision_id,
                    extra=dict(d.extra),
                )
                self._insert(conn, frag)
                self._insert_event(conn, user_id, fid, "add", frag.created_at, frag.text,
                                   d.decision_id if by is None else by, {})
                out.append(frag)
        return out

    def _replayed(self, existing: Fragment, draft: NewFragment) -> Fragment:
        """The committed fragment when `draft` replays its source turn; MemoryStoreError on an id collision."""
        if existing.source_text != draft.source_text:
            raise MemoryStoreError(
                f"memory store {self.path}: user {existing.user_id!r} already has memory {existing.fragment_id} "
                f"from another source turn at episode {draft.episode_id!r}, session {draft.session}, turn "
                f"{draft.turn}; two writers used the same session (allocate one per writer with "
                "MemoryStore.open_session); nothing of this batch was stored"
            )
        if existing.text != draft.text:
            logger.info("memory store: %s already holds %s; keeping the committed text", self.path,
                        existing.fragment_id)
        return existing

    def open_session(self, user_id: str, episode_id: str) -> int:
        """Allocate the next session number of `user_id` in `episode_id`: one more than any recorded or stored.

        Atomic across processes (one BEGIN IMMEDIATE transaction), so two writers never get the same session;
        numbers start at 1 and are never handed out twice while the user exists (`delete_user` resets them).
        """
        _check_user(user_id, "open_session")
        if not isinstance(episode_id, str) or not episode_id:
            raise ValueError(f"memory store: episode_id must be a non-empty string, got {episode_id!r}")
        check_text(episode_id, "MemoryStore.open_session", "episode_id")
        with self._tx(f"open_session for {user_id!r}") as conn:
            (highest,) = conn.execute(
                "SELECT MAX(s) FROM (SELECT MAX(session) AS s FROM sessions WHERE user_id = ? AND episode_id = ? "
                "UNION ALL SELECT MAX(session) FROM fragments WHERE user_id = ? AND episode_id = ?)",
                (user_id, episode_id, user_id, episode_id),
            ).fetchone()
            session = 1 + max(0, highest or 0)
            conn.execute(
                "INSERT INTO sessions (user_id, episode_id, session, opened_at) VALUES (?, ?, ?, ?)",
                (user_id, episode_id, session, float(self._clock())),
            )
        return session

    @staticmethod
    def _insert(conn: sqlite3.Connection, frag: Fragment) -> None:
        values = [getattr(frag, f) for f in FRAGMENT_FIELDS]
        values[FRAGMENT_FIELDS.index("extra")] = json.dumps(dict(frag.extra), allow_nan=False, sort_keys=True)
        conn.execute(
            f"INSERT INTO fragments ({_COLUMNS}) VALUES ({', '.join('?' * len(FRAGMENT_FIELDS))})", values
        )

    def supersede(self, user_id: str, fragment_ids: Sequence[str], by_fragment_id: str, *,
                  by: str | None = None) -> list[str]:
        """Mark `user_id`'s current fragments `fragment_ids` as made out of date by `by_fragment_id` (valid_to: now).

        One transaction, one "supersede" event each (by `by`). Ids that are unknown, another user's, already
        superseded or `by_fragment_id` itself are skipped; returns the ids actually marked, in the order given.
        ValueError when `by_fragment_id` is not a fragment of `user_id`.
        """
        _check_user(user_id, "supersede")
        if isinstance(fragment_ids, str):
            raise TypeError(f"memory store: fragment_ids must be a sequence of ids, not the string {fragment_ids!r}")
        fragment_ids = list(fragment_ids)
        for i, fid in enumerate(fragment_ids):
            _check_id(fid, "supersede", f"fragment_ids[{i}]")
        _check_id(by_fragment_id, "supersede", "by_fragment_id")
        _check_id(by, "supersede", "by")
        marked: list[str] = []
        with self._tx(f"supersede by {by_fragment_id} for {user_id!r}") as conn:
            newer = conn.execute("SELECT 1 FROM fragments WHERE user_id = ? AND fragment_id = ?",
                                 (user_id, by_fragment_id)).fetchone()
            if newer is None:
                raise ValueError(f"memory store {self.path}: user {user_id!r} has no memory {by_fragment_id!r} to "
                                 "supersede with; store the newer memory first")
            at = float(self._clock())
            for fid in dict.fromkeys(fragment_ids):
                if fid == by_fragment_id:
                    continue
                row = conn.execute("SELECT text FROM fragments WHERE user_id = ? AND fragment_id = ? AND "
                                   "superseded_by IS NULL", (user_id, fid)).fetchone()
                if row is None:
                    continue
                conn.execute("UPDATE fragments SET superseded_by = ?, valid_to = ? WHERE user_id = ? AND "
                             "fragment_id = ?", (by_fragment_id, at, user_id, fid))
                self._insert_event(conn, user_id, fid, "supersede", at, row[0], by,
                                   {"superseded_by": by_fragment_id})
                marked.append(fid)
        return marked

    def update(self, user_id: str, fragment_id: str, text: str, *, by: str | None = None) -> Fragment | None:
        """Replace the note of `user_id`'s fragment (an "update" event keeps the old text); None when the user has
        no such fragment. The source turn (provenance) is unchanged; the same text again records nothing."""
        _check_user(user_id, "update")
        _check_id(fragment_id, "update")
        _check_id(by, "update", "by")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"memory store: the new text of {fragment_id!r} for {user_id!r} must be a non-empty "
                             f"string, got {text!r}")
        check_text(text, "MemoryStore.update", "text")
        with self._tx(f"update of {fragment_id} for {user_id!r}") as conn:
            row = conn.execute(f"SELECT {_COLUMNS} FROM fragments WHERE user_id = ? AND fragment_id = ?",
                               (user_id, fragment_id)).fetchone()
            if row is None:
                return None
            old = _row_to_fragment(row)
            if old.text == text:
                return old
            conn.execute("UPDATE fragments SET text = ? WHERE user_id = ? AND fragment_id = ?",
                         (text, user_id, fragment_id))
            self._insert_event(conn, user_id, fragment_id, "update", float(self._clock()), text, by,
                               {"old_text": old.text})
        return dataclasses.replace(old, text=text)

    def delete(self, user_id: str, fragment_id: str) -> bool:
        """Erase one fragment of `user_id` and its events (no copy stays in the files); False when the user has
        no such fragment. Fragments it superseded stay superseded."""
        _check_user(user_id, "delete")
        _check_id(fragment_id, "delete")
        with self._lock:
            with self._tx(f"delete of {fragment_id} for {user_id!r}") as conn:
                conn.execute("DELETE FROM events WHERE user_id = ? AND fragment_id = ?", (user_id, fragment_id))
                cur = conn.execute("DELETE FROM fragments WHERE user_id = ? AND fragment_id = ?",
                                   (user_id, fragment_id))
                gone = cur.rowcount > 0
            if gone:
                self._scrub(f"delete of {fragment_id} for {user_id!r}")
        return gone

    def delete_user(self, user_id: str) -> int:
        """Erase everything about `user_id` (fragments, events, session records; no copy stays in the files);
        returns how many fragments went."""
        _check_user(user_id, "delete_user")
        with self._lock:
            with self._tx(f"delete_user {user_id!r}") as conn:
                conn.execute("DELETE FROM sessions WHERE user_id = ?", (user_id,))
                conn.execute("DELETE FROM events WHERE user_id = ?", (user_id,))
                n = conn.execute("DELETE FROM fragments WHERE user_id = ?", (user_id,)).rowcount
            self._scrub(f"delete_user {user_id!r}")
        return n

    # -- reads (always scoped to one user) -----------------------------------------------------------

    def get(self, user_id: str, fragment_id: str) -> Fragment | None:
        """The fragment if it belongs to `user_id`, else None (another user's id looks like a missing one)."""
        _check_user(user_id, "get")
        _check_id(fragment_id, "get")
        rows = self._query(
            f"SELECT {_COLUMNS} FROM fragments WHERE user_id = ? AND fragment_id = ?", (user_id, fragment_id)
        )
        return rows[0] if rows else None

    def fragments(
        self, user_id: str, *, episode_id: str | None = None, session: int | None = None, current_only: bool = False
    ) -> list[Fragment]:
        """All fragments of `user_id` ordered by creation, optionally filtered; `current_only`: without the
        superseded ones (the Trigger's memory M)."""
        _check_user(user_id, "fragments")
        _check_id(episode_id, "fragments", "episode_id")
        sql = f"SELECT {_COLUMNS} FROM fragments WHERE user_id = ?"
        params: list[Any] = [user_id]
        if current_only:
            sql += " AND superseded_by IS NULL"
        if episode_id is not None:
            sql += " AND episode_id = ?"
            params.append(episode_id)
        if session is not None:
            sql += " AND session = ?"
            params.append(session)
        return self._query(f"{sql} {_ORDER}", params)

    list = fragments  # "list" in the vocabulary

    def count(self, user_id: str, *, current_only: bool = False) -> int:
        """How many fragments `user_id` has, superseded ones included unless `current_only`."""
        _check_user(user_id, "count")
        current = " AND superseded_by IS NULL" if current_only else ""
        with self._lock:
            return int(self._conn.execute(f"SELECT COUNT(*) FROM fragments WHERE user_id = ?{current}",
                                          (user_id,)).fetchone()[0])

    def session_count(self, user_id: str) -> int:
        """How many sessions are recorded for `user_id` (`open_session`'s records, kept until `delete_user`)."""
        _check_user(user_id, "session_count")
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM sessions WHERE user_id = ?", (user_id,)).fetchone()[0])

    def top_k(self, user_id: str, query: str, k: int) -> list[Fragment]:
        """Up to k of `user_id`'s current fragments most lexically relevant to `query` (BM25 over note + source).

        Best first; ties (including no overlap at all) go to the most recent, so the result always has
        min(k, current count) fragments: a cap for the Trigger's candidate list, not a filter. Under the cap, all
        current fragments come back in creation order.
        """
        frags = self.fragments(user_id, current_only=True)
        return [frags[i] for i in self._top_indices(frags, query, k)]

    def candidates(self, user_id: str, query: str, max_candidates: int) -> list[Fragment]:
        """The Trigger's memory list: top_k(query, max_candidates), in creation order (superseded ones never).

        Creation order keeps a fragment's index stable from one turn to the next while nothing is capped.
        """
        frags = self.fragments(user_id, current_only=True)
        return [frags[i] for i in sorted(self._top_indices(frags, query, max_candidates))]

    def search(self, user_id: str, query: str, k: int | None = None) -> list[tuple[Fragment, float]]:
        """`user_id`'s current fragments with their BM25 score for `query` (note + source text), best first (ties:
        the most recent), at most `k` (None: all); zero scores (no word in common) included."""
        frags = self.fragments(user_id, current_only=True)
        scores = bm25_scores(query, [f"{f.text} {f.source_text}" for f in frags])
        order = rank(scores) if k is None else rank(scores)[: max(0, k)]
        return [(frags[i], scores[i]) for i in order]

    @staticmethod
    def _top_indices(frags: Sequence[Fragment], query: str, k: int) -> list[int]:
        if k <= 0:
            return []
        if len(frags) <= k:
            return list(range(len(frags)))
        return rank(bm25_scores(query, [f"{f.text} {f.source_text}" for f in frags]))[:k]

    def history(self, user_id: str, fragment_id: str) -> list[MemoryEvent]:
        """Every change of `user_id`'s fragment, oldest first; [] when the user has no such fragment."""
        _check_user(user_id, "history")
        _check_id(fragment_id, "history")
        return self._events(f"SELECT {_EVENT_COLUMNS} FROM events WHERE user_id = ? AND fragment_id = ? "
                            "ORDER BY seq", (user_id, fragment_id))

    def timeline(self, user_id: str) -> list[MemoryEvent]:
        """Every change of every fragment of `user_id`, in the order they happened."""
        _check_user(user_id, "timeline")
        return self._events(f"SELECT {_EVENT_COLUMNS} FROM events WHERE user_id = ? ORDER BY seq", (user_id,))

    def user_ids(self) -> list[str]:
        """Users that have at least one fragment (an admin listing; it returns no fragment)."""
        with self._lock:
            return [r[0] for r in self._conn.execute("SELECT DISTINCT user_id FROM fragments ORDER BY user_id")]

    # -- export / import (JSON Lines, one user at a time) --------------------------------------------

    def export_jsonl(self, user_id: str, dest: str | os.PathLike[str] | IO[str]) -> int:
        """Write `user_id`'s fragments as JSON Lines (creation order), each with its events; returns how many."""
        with self._snapshot():
            frags = self.fragments(user_id)
            events: dict[str, list[dict[str, Any]]] = {}
            for e in self.timeline(user_id):
                events.setdefault(e.fragment_id, []).append(_record_event(e))
        lines = "".join(
            json.dumps({"format": EXPORT_FORMAT, **f.to_json(), "events": events.get(f.fragment_id, [])},
                       ensure_ascii=False) + "\n"
            for f in frags
        )
        if hasattr(dest, "write"):
            dest.write(lines)  # type: ignore[union-attr]
        else:
            tmp = Path(f"{os.fspath(dest)}.tmp")
            tmp.write_text(lines, encoding="utf-8")
            os.replace(tmp, dest)  # never leave a half-written export behind
        return len(frags)

    def import_jsonl(self, user_id: str, src: str | os.PathLike[str] | IO[str]) -> int:
        """Load fragments exported for `user_id`, with their events, all or nothing; returns how many were new.

        Records of another user are refused (the error names the source and line). A fragment id already
        present with identical content is skipped (its events too); with different content it is a conflict.
        Events keep their order (renumbered after this store's own). Records of format "/1" import as current
        fragments with one "add" event derived from the record (their text never changed).
        """
        _check_user(user_id, "import_jsonl")
        if hasattr(src, "read"):
            name, text = getattr(src, "name", "<stream>"), src.read()  # type: ignore[union-attr]
        else:
            name, text = os.fspath(src), Path(src).read_text(encoding="utf-8")  # type: ignore[arg-type]
        records = [
            self._parse_record(user_id, name, n, line)
            for n, line in enumerate(text.splitlines(), 1)
            if line.strip()
        ]
        added = 0
        with self._tx(f"import of {name}") as conn:
            new_events: list[tuple[tuple[int, int, int], str, dict[str, Any]]] = []
            for lineno, frag, events in records:
                row = conn.execute(
                    f"SELECT {_COLUMNS} FROM fragments WHERE fragment_id = ? AND user_id = ?",
                    (frag.fragment_id, user_id),
                ).fetchone()
                if row is not None:
                    existing = _row_to_fragment(row)
                    if existing != frag:
                        raise MemoryStoreError(
                            f"memory import {name}:{lineno}: fragment {frag.fragment_id} already exists with "
                            "different content"
                        )
                    continue
                self._insert(conn, frag)
                added += 1
                new_events += [((e["seq"], lineno, i), frag.fragment_id, e) for i, e in enumerate(events)]
            for _, fid, e in sorted(new_events, key=lambda x: x[0]):
                self._insert_event(conn, user_id, fid, e["event"], e["at"], e["text"], e["by"], e["detail"])
        return added

    @staticmethod
    def _parse_record(user_id: str, name: str, lineno: int, line: str
                      ) -> tuple[int, Fragment, list[dict[str, Any]]]:
        """(line, fragment, its events) of one export line; MemoryStoreError naming the source and line."""
        where = f"memory import {name}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise MemoryStoreError(f"{where}: invalid JSON ({e.msg})") from e
        if not isinstance(obj, dict) or obj.get("format") not in (EXPORT_FORMAT, _FORMAT_V1):
            raise MemoryStoreError(f"{where}: not a fragment record of format {EXPORT_FORMAT!r} (or {_FORMAT_V1!r})")
        v1 = obj["format"] == _FORMAT_V1
        missing = [f for f in (_V1_FIELDS if v1 else (*FRAGMENT_FIELDS, "events")) if f not in obj]
        if missing:
            raise MemoryStoreError(f"{where}: missing field(s) {missing}")
        if obj["user_id"] != user_id:
            raise MemoryStoreError(f"{where}: record belongs to another user, refusing to import it for {user_id!r}")
        fields = {f: obj.get(f) for f in FRAGMENT_FIELDS}
        try:
            if not isinstance(obj["extra"], dict):
                raise ValueError("memory fragment: extra must be a JSON object")
            if not _is_number(obj["created_at"]):
                raise ValueError("memory fragment: created_at must be a number")
            draft = NewFragment(**{f: obj[f] for f in _DRAFT_FIELDS})
            validate_new(user_id, draft)
            _check_version(fields["superseded_by"], fields["valid_to"])
            events = [_make_event(fields["created_at"], draft.text, draft.decision_id)] if v1 else _check_events(
                obj["events"])
        except ValueError as e:
            raise MemoryStoreError(f"{where}: {e}") from e
        expected_id = fragment_id_for(user_id, draft.episode_id, draft.session, draft.turn)
        if obj["fragment_id"] != expected_id:
            raise MemoryStoreError(f"{where}: fragment_id {obj['fragment_id']!r} does not match its provenance")
        valid_to = fields["valid_to"]
        fields |= {"created_at": float(obj["created_at"]), "valid_to": None if valid_to is None else float(valid_to)}
        return lineno, Fragment(**fields), events


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_version(superseded_by: Any, valid_to: Any) -> None:
    """ValueError unless the record is current (both None) or superseded (an id and a time)."""
    if superseded_by is None and valid_to is None:
        return
    if not (isinstance(superseded_by, str) and superseded_by and _is_number(valid_to)):
        raise ValueError(f"memory fragment: superseded_by (an id) and valid_to (a number) go together, got "
                         f"{superseded_by!r} and {valid_to!r}")


def _make_event(at: float, text: str, by: str | None) -> dict[str, Any]:
    """The "add" event of a record written before events existed (sorted before every recorded event)."""
    return {"seq": -1, "event": "add", "at": float(at), "text": text, "by": by, "detail": {}}


def _check_events(events: Any) -> list[dict[str, Any]]:
    """The events of a "/2" record, checked field by field (ValueError naming the event and field)."""
    if not isinstance(events, list):
        raise ValueError("memory fragment: events must be a list")
    out = []
    for i, e in enumerate(events):
        what = f"memory fragment: event {i}"
        if not isinstance(e, dict):
            raise ValueError(f"{what} must be a JSON object")
        missing = [f for f in ("seq", "event", "at", "text", "by", "detail") if f not in e]
        if missing:
            raise ValueError(f"{what}: missing field(s) {missing}")
        if isinstance(e["seq"], bool) or not isinstance(e["seq"], int):
            raise ValueError(f"{what}: seq must be an int")
        if e["event"] not in EVENT_KINDS:
            raise ValueError(f"{what}: event must be one of {EVENT_KINDS}, got {e['event']!r}")
        if not _is_number(e["at"]):
            raise ValueError(f"{what}: at must be a number")
        if not isinstance(e["text"], str) or not (e["by"] is None or isinstance(e["by"], str)):
            raise ValueError(f"{what}: text must be a string and by a string or null")
        check_text(e["text"], what, "text")
        if e["by"] is not None:
            check_text(e["by"], what, "by")
        if not isinstance(e["detail"], dict):
            raise ValueError(f"{what}: detail must be a JSON object")
        out.append({"seq": e["seq"], "event": e["event"], "at": float(e["at"]), "text": e["text"], "by": e["by"],
                    "detail": e["detail"]})
    return out

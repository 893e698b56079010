"""MemoryStore: per-user memory fragments with provenance, persisted in SQLite.

Isolation is structural: every read and delete takes the user id and filters on it in SQL, so no call can
return another user's fragments. Every write runs in one transaction (BEGIN IMMEDIATE ... COMMIT) with
synchronous=FULL, so a crash mid-write loses nothing committed and leaves no partial batch behind.

Several processes may share one database file (WAL, busy timeout): `open_session` hands each writer its own
session number, so the ids of their fragments, derived from (user, episode, session, turn), never collide; an id
already holding another source turn is refused (MemoryStoreError), never silently dropped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from icml_jax.memory.fragment import FRAGMENT_FIELDS, Fragment, NewFragment, fragment_id_for, validate_new
from icml_jax.memory.lexical import bm25_scores

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 2
EXPORT_FORMAT = "icml_jax.memory.fragment/1"

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
# version -> the DDL that takes a database of the version before it there; every statement is idempotent.
_MIGRATIONS: dict[int, str] = {1: _SCHEMA_V1, 2: _SCHEMA_V2}
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


def _check_user(user_id: str) -> None:
    if not isinstance(user_id, str) or not user_id:
        raise ValueError(f"memory store: user_id must be a non-empty string, got {user_id!r}")


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

    def _query(self, sql: str, params: Sequence[Any]) -> list[Fragment]:
        with self._lock:
            return [_row_to_fragment(r) for r in self._conn.execute(sql, params).fetchall()]

    def close(self) -> None:
        """Close the database (WAL is checkpointed)."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes ------------------------------------------------------------------------------------

    def append(self, user_id: str, draft: NewFragment) -> Fragment:
        """Store one fragment for `user_id` and return it (see append_many for the id and duplicates)."""
        return self.append_many(user_id, [draft])[0]

    def append_many(self, user_id: str, drafts: Sequence[NewFragment]) -> list[Fragment]:
        """Store fragments for `user_id` in one transaction, all or nothing; returns the stored fragments, in order.

        The id is derived from (user, episode, session, turn), so saving the same source turn twice is
        idempotent: the fragment committed first is kept and returned, even when its note was condensed
        differently (e.g. a step replayed after a crash). An id that holds a different source turn means two
        writers shared a session (see `open_session`): that raises MemoryStoreError and stores nothing.
        """
        _check_user(user_id)
        for d in drafts:
            validate_new(user_id, d)
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
        _check_user(user_id)
        if not isinstance(episode_id, str) or not episode_id:
            raise ValueError(f"memory store: episode_id must be a non-empty string, got {episode_id!r}")
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

    def delete(self, user_id: str, fragment_id: str) -> bool:
        """Forget one fragment of `user_id`; False when the user has no such fragment."""
        _check_user(user_id)
        with self._tx("delete") as conn:
            cur = conn.execute("DELETE FROM fragments WHERE user_id = ? AND fragment_id = ?", (user_id, fragment_id))
            return cur.rowcount > 0

    def delete_user(self, user_id: str) -> int:
        """Forget everything about `user_id` (fragments and session records); returns how many fragments went."""
        _check_user(user_id)
        with self._tx("delete_user") as conn:
            conn.execute("DELETE FROM sessions WHERE user_id = ?", (user_id,))
            return conn.execute("DELETE FROM fragments WHERE user_id = ?", (user_id,)).rowcount

    # -- reads (always scoped to one user) -----------------------------------------------------------

    def get(self, user_id: str, fragment_id: str) -> Fragment | None:
        """The fragment if it belongs to `user_id`, else None (another user's id looks like a missing one)."""
        _check_user(user_id)
        rows = self._query(
            f"SELECT {_COLUMNS} FROM fragments WHERE user_id = ? AND fragment_id = ?", (user_id, fragment_id)
        )
        return rows[0] if rows else None

    def fragments(
        self, user_id: str, *, episode_id: str | None = None, session: int | None = None
    ) -> list[Fragment]:
        """All fragments of `user_id` ordered by creation (the Trigger's memory M), optionally filtered."""
        _check_user(user_id)
        sql = f"SELECT {_COLUMNS} FROM fragments WHERE user_id = ?"
        params: list[Any] = [user_id]
        if episode_id is not None:
            sql += " AND episode_id = ?"
            params.append(episode_id)
        if session is not None:
            sql += " AND session = ?"
            params.append(session)
        return self._query(f"{sql} {_ORDER}", params)

    list = fragments  # "list" in the vocabulary

    def count(self, user_id: str) -> int:
        """How many fragments `user_id` has."""
        _check_user(user_id)
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM fragments WHERE user_id = ?", (user_id,)).fetchone()[0])

    def top_k(self, user_id: str, query: str, k: int) -> list[Fragment]:
        """Up to k of `user_id`'s fragments most lexically relevant to `query` (BM25 over note + source text).

        Best first; ties (including no overlap at all) go to the most recent, so the result always has
        min(k, count) fragments: a cap for the Trigger's candidate list, not a filter. Under the cap, all
        fragments come back in creation order.
        """
        frags = self.fragments(user_id)
        return [frags[i] for i in self._top_indices(frags, query, k)]

    def candidates(self, user_id: str, query: str, max_candidates: int) -> list[Fragment]:
        """The Trigger's memory list: top_k(query, max_candidates), in creation order.

        Creation order keeps a fragment's index stable from one turn to the next while nothing is capped.
        """
        frags = self.fragments(user_id)
        return [frags[i] for i in sorted(self._top_indices(frags, query, max_candidates))]

    @staticmethod
    def _top_indices(frags: Sequence[Fragment], query: str, k: int) -> list[int]:
        if k <= 0:
            return []
        if len(frags) <= k:
            return list(range(len(frags)))
        scores = bm25_scores(query, [f"{f.text} {f.source_text}" for f in frags])
        return sorted(range(len(frags)), key=lambda i: (-scores[i], -i))[:k]

    def user_ids(self) -> list[str]:
        """Users that have at least one fragment (an admin listing; it returns no fragment)."""
        with self._lock:
            return [r[0] for r in self._conn.execute("SELECT DISTINCT user_id FROM fragments ORDER BY user_id")]

    # -- export / import (JSON Lines, one user at a time) --------------------------------------------

    def export_jsonl(self, user_id: str, dest: str | os.PathLike[str] | IO[str]) -> int:
        """Write `user_id`'s fragments as JSON Lines (creation order); returns how many were written."""
        frags = self.fragments(user_id)
        lines = "".join(json.dumps({"format": EXPORT_FORMAT, **f.to_json()}, ensure_ascii=False) + "\n" for f in frags)
        if hasattr(dest, "write"):
            dest.write(lines)  # type: ignore[union-attr]
        else:
            tmp = Path(f"{os.fspath(dest)}.tmp")
            tmp.write_text(lines, encoding="utf-8")
            os.replace(tmp, dest)  # never leave a half-written export behind
        return len(frags)

    def import_jsonl(self, user_id: str, src: str | os.PathLike[str] | IO[str]) -> int:
        """Load fragments exported for `user_id`, all or nothing; returns how many were new.

        Records of another user are refused (the error names the source and line). A fragment id already
        present with identical content is skipped; with different content it is a conflict.
        """
        _check_user(user_id)
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
            for lineno, frag in records:
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
        return added

    @staticmethod
    def _parse_record(user_id: str, name: str, lineno: int, line: str) -> tuple[int, Fragment]:
        where = f"memory import {name}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise MemoryStoreError(f"{where}: invalid JSON ({e.msg})") from e
        if not isinstance(obj, dict) or obj.get("format") != EXPORT_FORMAT:
            raise MemoryStoreError(f"{where}: not a fragment record of format {EXPORT_FORMAT!r}")
        missing = [f for f in FRAGMENT_FIELDS if f not in obj]
        if missing:
            raise MemoryStoreError(f"{where}: missing field(s) {missing}")
        if obj["user_id"] != user_id:
            raise MemoryStoreError(f"{where}: record belongs to another user, refusing to import it for {user_id!r}")
        try:
            if not isinstance(obj["extra"], dict):
                raise ValueError("memory fragment: extra must be a JSON object")
            if not isinstance(obj["created_at"], (int, float)) or isinstance(obj["created_at"], bool):
                raise ValueError("memory fragment: created_at must be a number")
            draft = NewFragment(**{f: obj[f] for f in _DRAFT_FIELDS})
            validate_new(user_id, draft)
        except ValueError as e:
            raise MemoryStoreError(f"{where}: {e}") from e
        expected_id = fragment_id_for(user_id, draft.episode_id, draft.session, draft.turn)
        if obj["fragment_id"] != expected_id:
            raise MemoryStoreError(f"{where}: fragment_id {obj['fragment_id']!r} does not match its provenance")
        return lineno, Fragment(**{f: obj[f] for f in FRAGMENT_FIELDS} | {"created_at": float(obj["created_at"])})

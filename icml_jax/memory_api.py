"""`Memory`: a Mem0-shaped API (add / search / get_all / get / update / delete / delete_all / history) over the
SQLite MemoryStore, optionally with an LLM that condenses saved turns and a trained policy that decides them.
A user-facing tool (`from icml_jax.memory_api import Memory`) on top of the memory package and a trained agent
(`icml_jax.run.agent_loading`, as the chat loads it).

Every call names its user, and every store call it makes is scoped to that user: another user's memory id behaves
exactly like a missing one (None, False, [] or {"results": []}), so no call returns or changes another user's
memory. Each `add` is a new session of the user's "api" episode (`MemoryStore.open_session`), so ids never collide.

Every text argument (messages, ids, a query, a new text) is checked where it enters (`icml_jax.textcheck`): text
that is not valid Unicode or is longer than `TextLimits.max_text_chars` is refused with one TextError naming the
method, the argument and the offset, before anything is stored (no session is opened for a refused `add`).
Search results carry the whole memory and an excerpt of its source turn (`TextLimits.source_excerpt_chars`;
`get` returns the whole source).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from icml_jax.llm.types import LLMBackend
from icml_jax.memory.fragment import Fragment, MemoryEvent, NewFragment
from icml_jax.memory.store import MemoryStore
from icml_jax.memory.writer import TurnToSave, save_turns
from icml_jax.textcheck import TextError, TextLimits, check_text, excerpt

logger = logging.getLogger(__name__)

API_EPISODE = "api"  # the episode every `add` opens a session of
API_BY = "api"  # who made a change through this API (fragments' decision_id and events' `by` without a policy)
API_POLICY = "api"  # policy_version of memories saved without a trained policy
SUPERSEDE_CANDIDATES = 3  # current memories the generator may mark as out of date by a new note (as the agent)
Message = Mapping[str, Any]


def default_path() -> Path:
    """Where `Memory()` keeps its database: `$XDG_CACHE_HOME/icml_jax/memory.sqlite` (an absolute
    XDG_CACHE_HOME only, as the XDG spec says), else `~/.cache/icml_jax/memory.sqlite`."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "icml_jax" / "memory.sqlite"


def parse_messages(messages: str | bytes | Message | Sequence[Message], *,
                   max_chars: int | None = None) -> list[tuple[str, str]]:
    """(role, content) of each message, as Mem0 takes them: a string (one user message), one {"role", "content"}
    dict, or a list of them; TypeError naming the message that is none of those, TextError naming the message
    whose text is not valid Unicode (bytes: UTF-8) or longer than `max_chars`."""
    if isinstance(messages, (str, bytes)):
        return [("user", check_text(messages, "Memory.add", "messages", max_chars=max_chars))]
    if isinstance(messages, Mapping):
        messages = [messages]
    if not isinstance(messages, Sequence):
        raise TypeError(f"Memory.add: messages must be a string or a list of {{'role', 'content'}} dicts, got "
                        f"{type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not (isinstance(m, Mapping) and isinstance(m.get("role"), (str, bytes))
                and isinstance(m.get("content"), (str, bytes))):
            raise TypeError(f"Memory.add: messages[{i}] must be a dict with string 'role' and 'content', got {m!r}")
        out.append((check_text(m["role"], "Memory.add", f"messages[{i}].role", max_chars=max_chars),
                    check_text(m["content"], "Memory.add", f"messages[{i}].content", max_chars=max_chars)))
    return out


def _require_user(user_id: Any, method: str) -> str:
    """`user_id` when it is a non-empty string of valid text: every call must say whose memory it touches."""
    if not isinstance(user_id, str):
        raise TypeError(f"Memory.{method}: user_id is required (a non-empty string), got {user_id!r}")
    return check_text(user_id, f"Memory.{method}", "user_id", nonempty=True)


def _require_id(memory_id: Any, method: str) -> str:
    """`memory_id` when it is a string of valid text (an unknown id then simply matches nothing)."""
    if not isinstance(memory_id, str):
        raise TypeError(f"Memory.{method}: memory_id must be a string (an id from add/get_all), got {memory_id!r}")
    return check_text(memory_id, f"Memory.{method}", "memory_id")


def _metadata_extra(metadata: Mapping[str, Any] | None, limits: TextLimits) -> dict[str, Any]:
    """The fragment `extra` that carries `metadata` ({} without); TypeError unless a JSON-able mapping, TextError
    when its JSON is longer than `limits.max_metadata_chars`."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"Memory.add: metadata must be a dict, got {type(metadata).__name__}")
    try:
        as_json = json.dumps(dict(metadata), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"Memory.add: metadata must be JSON-serialisable ({e})") from e
    check_text(as_json, "Memory.add", "metadata (as JSON)", max_chars=limits.max_metadata_chars,
               limit_key="limits.max_metadata_chars")
    return {"metadata": dict(metadata)}


def _iso(t: float | None) -> str | None:
    """A store clock reading as ISO 8601 in UTC (Mem0's timestamps)."""
    return None if t is None else datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat()


def memory_item(f: Fragment) -> dict[str, Any]:
    """A fragment as Mem0 shows a memory, plus its source turn and version."""
    return {"id": f.fragment_id, "memory": f.text, "user_id": f.user_id, "metadata": f.extra.get("metadata"),
            "created_at": _iso(f.created_at), "source": f.source_text, "superseded_by": f.superseded_by,
            "valid_to": _iso(f.valid_to)}


def history_item(e: MemoryEvent) -> dict[str, Any]:
    """An event as Mem0 shows a history entry: ADD / UPDATE / SUPERSEDE with the text before and after."""
    old = None if e.event == "add" else e.detail.get("old_text", e.text)
    return {"id": e.fragment_id, "memory": e.text, "event": e.event.upper(), "old_memory": old,
            "new_memory": e.text, "created_at": _iso(e.at), "by": e.by, "detail": dict(e.detail)}


class Memory:
    """A Mem0-like memory layer: per-user memories in one SQLite file, with optional condensation and policy.

    `path`: the database (None: `default_path()`; ":memory:" for a throw-away one). `generator`: an LLM back end
    that condenses each saved user message into a note and may mark older memories as out of date (without it,
    messages are stored verbatim); the caller keeps ownership of it. `workdir`: a trained run (as
    `python -m icml_jax.chat` loads it) whose Planner decides which messages to save and whose Trigger's pick
    leads `search`; its own back end condenses unless `generator` is given. `limits`: the size caps (None: the
    run's `config.limits` with a `workdir`, else the TextLimits defaults).
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, generator: LLMBackend | None = None,
                 workdir: str | os.PathLike[str] | None = None, limits: TextLimits | None = None) -> None:
        self.store = MemoryStore(default_path() if path is None else path)
        self.generator = generator
        self._model: Any = None
        self._agent: Any = None
        if workdir is not None:
            try:
                self._load_policy(workdir)
            except BaseException:
                self.store.close()
                raise
        if limits is None:
            limits = self._model.limits if self._model is not None else TextLimits()
        self.limits = limits

    def _load_policy(self, workdir: str | os.PathLike[str]) -> None:
        """Loads the trained run (as the chat loads it)."""
        from icml_jax.run import agent_loading  # local: flax, Orbax, transformers only for a Memory with a run

        self._model = agent_loading.load_model(workdir)
        self._agent = self._model.agent(self.store)
        if self.generator is not None:
            self._agent.condenser = self.generator

    def __repr__(self) -> str:
        policy = f", workdir={str(self._model.workdir)!r}" if self._model is not None else ""
        return f"Memory(path={self.store.path!r}{policy})"

    def close(self) -> None:
        """Closes the database and the trained run's back end (not a `generator` passed in)."""
        self.store.close()
        if self._model is not None:
            self._model.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes ------------------------------------------------------------------------------------

    def add(self, messages: str | Message | Sequence[Message], user_id: str, *,
            metadata: Mapping[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
        """Remember `user_id`'s messages: every user message (condensed by the generator if any), or those the
        trained Planner saves. {"results": [{"id", "memory", "event": "ADD"}, ...]}, plus {"event": "SUPERSEDE"}
        entries for older memories a new note made out of date. `metadata` is kept with each new memory."""
        user = _require_user(user_id, "add")
        turns = parse_messages(messages, max_chars=self.limits.max_text_chars)  # all checked before any write
        extra = _metadata_extra(metadata, self.limits)
        wanted = [i for i, (role, text) in enumerate(turns) if role == "user" and text.strip()]
        if not wanted:
            return {"results": []}
        session = self.store.open_session(user, API_EPISODE)
        if self._agent is not None:
            saved = self._add_with_policy(user, turns, wanted, session, extra)
        elif self.generator is not None:
            saved = save_turns(self.store, self.generator, user,
                               [TurnToSave(API_EPISODE, session, i, turns[i][1], self._history(turns, i), API_BY,
                                           extra) for i in wanted],
                               policy_version=API_POLICY, supersede=SUPERSEDE_CANDIDATES)
        else:
            saved = self.store.append_many(user, [NewFragment(API_EPISODE, session, i, turns[i][1],
                                                              turns[i][1].strip(), API_POLICY, API_BY, extra)
                                                  for i in wanted])
        new = {f.fragment_id: f for f in saved}
        replaced = [f for f in self.store.fragments(user) if f.superseded_by in new]
        return {"results": [{**memory_item(f), "event": "ADD"} for f in new.values()]
                + [{**memory_item(f), "event": "SUPERSEDE"} for f in replaced]}

    def _add_with_policy(self, user: str, turns: list[tuple[str, str]], wanted: list[int], session: int,
                         extra: Mapping[str, Any]) -> list[Fragment]:
        """The Planner's saves among the user messages `wanted` (MemoryAgent.remember, one turn at a time)."""
        if extra:
            logger.warning("Memory.add: metadata is not kept with memories a trained policy saves "
                           "(MemoryAgent.remember takes none); it was dropped for user %r", user)
        saved = []
        for i in wanted:
            _, frag = self._agent.remember(user, turns[i][1], history=self._history(turns, i),
                                           episode_id=API_EPISODE, session=session, turn=i)
            if frag is not None:
                saved.append(frag)
        return saved

    def _history(self, turns: Sequence[tuple[str, str]], i: int) -> tuple[tuple[str, str], ...]:
        """The messages before message i as (speaker, text), speakers named as the trained run names them."""
        names = dict(zip(("user", "assistant"), self._model.speakers)) if self._model is not None else {}
        return tuple((names.get(role, role), text) for role, text in turns[:i])

    def update(self, memory_id: str, text: str, *, user_id: str) -> dict[str, Any] | None:
        """Replace the text of `user_id`'s memory (its history keeps the old text); None when the user has none
        with that id."""
        user = _require_user(user_id, "update")
        memory_id = _require_id(memory_id, "update")
        if isinstance(text, (str, bytes)):
            text = check_text(text, "Memory.update", "text", max_chars=self.limits.max_text_chars)
            if not text.strip():
                raise TextError("Memory.update", "text", "must be a non-empty string (not only spaces)")
        frag = self.store.update(user, memory_id, text, by=API_BY)
        return None if frag is None else {**memory_item(frag), "event": "UPDATE"}

    def delete(self, memory_id: str, *, user_id: str) -> bool:
        """Erase one memory of `user_id` and its history; False when the user has none with that id."""
        return self.store.delete(_require_user(user_id, "delete"), _require_id(memory_id, "delete"))

    def delete_all(self, user_id: str) -> int:
        """Erase every memory, history and session of `user_id`; returns how many memories went."""
        return self.store.delete_user(_require_user(user_id, "delete_all"))

    # -- reads -------------------------------------------------------------------------------------

    def get(self, memory_id: str, *, user_id: str) -> dict[str, Any] | None:
        """`user_id`'s memory with that id (superseded ones too), else None."""
        frag = self.store.get(_require_user(user_id, "get"), _require_id(memory_id, "get"))
        return None if frag is None else memory_item(frag)

    def get_all(self, user_id: str, *, include_superseded: bool = False) -> dict[str, list[dict[str, Any]]]:
        """{"results": [...]}: `user_id`'s current memories (also the superseded ones if asked), oldest first."""
        user = _require_user(user_id, "get_all")
        return {"results": [memory_item(f) for f in self.store.fragments(user, current_only=not include_superseded)]}

    def search(self, query: str, user_id: str, *, limit: int = 5) -> dict[str, list[dict[str, Any]]]:
        """{"results": [...]}: up to `limit` of `user_id`'s current memories, best BM25 `score` first (zero: no
        word in common); with a trained policy, the Trigger's pick comes first (with its `trigger_prob`). Each
        result's `source` is an excerpt of its source turn (`limits.source_excerpt_chars`; `get` has it whole)."""
        user = _require_user(user_id, "search")
        if not isinstance(query, (str, bytes)):
            raise TypeError(f"Memory.search: query must be a string, got {type(query).__name__}")
        query = check_text(query, "Memory.search", "query", max_chars=self.limits.max_text_chars)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"Memory.search: limit must be an int >= 0, got {limit!r}")
        scored = self.store.search(user, query)
        items = [{**memory_item(f), "score": score} for f, score in scored]
        if self._agent is not None and items and limit:
            trigger, pick = self._agent.choose_memory(user, query, episode_id=API_EPISODE)
            if pick is not None:  # (absent from `scored` only if another writer changed it in between)
                at = next((i for i, (f, _) in enumerate(scored) if f.fragment_id == pick.fragment_id), None)
                first = items.pop(at) if at is not None else {**memory_item(pick), "score": 0.0}
                items.insert(0, {**first, "trigger_prob": trigger.prob})
        cap = self.limits.source_excerpt_chars
        return {"results": [{**item, "source": excerpt(item["source"], cap)} for item in items[:limit]]}

    def history(self, memory_id: str, *, user_id: str) -> list[dict[str, Any]]:
        """Every change of `user_id`'s memory, oldest first ({"event": "ADD" | "UPDATE" | "SUPERSEDE", ...});
        [] when the user has none with that id."""
        events = self.store.history(_require_user(user_id, "history"), _require_id(memory_id, "history"))
        return [history_item(e) for e in events]

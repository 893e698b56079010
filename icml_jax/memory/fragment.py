"""A memory fragment with its provenance, the draft a caller hands to the store to create one, and the events
that record every change of a fragment (its version history)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from icml_jax.textcheck import check_text

FRAGMENT_FIELDS: tuple[str, ...] = (
    "fragment_id",
    "user_id",
    "episode_id",
    "session",
    "turn",
    "source_text",
    "text",
    "created_at",
    "policy_version",
    "decision_id",
    "extra",
    "superseded_by",
    "valid_to",
)
EVENT_FIELDS: tuple[str, ...] = ("seq", "user_id", "fragment_id", "event", "at", "text", "by", "detail")
EVENT_KINDS: tuple[str, ...] = ("add", "update", "supersede")


@dataclasses.dataclass(frozen=True)
class NewFragment:
    """What a save decision produces: the source turn, its condensed note, and who decided to save it."""

    episode_id: str
    session: int
    turn: int
    source_text: str
    text: str
    policy_version: str
    decision_id: str | None = None  # opaque id of the save decision (links the Pending Reward Buffer)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # JSON-able, e.g. r_proxy, speaker


@dataclasses.dataclass(frozen=True)
class Fragment:
    """A stored memory m_i of one user; `fragment_id` is stable across reopen, export and import."""

    fragment_id: str
    user_id: str
    episode_id: str
    session: int
    turn: int
    source_text: str
    text: str
    created_at: float
    policy_version: str
    decision_id: str | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    superseded_by: str | None = None  # id of the newer fragment that made this one out of date (None: current)
    valid_to: float | None = None  # store clock when it was superseded

    @property
    def current(self) -> bool:
        """Whether no newer fragment supersedes this one (only current fragments are offered to the Trigger)."""
        return self.superseded_by is None

    @property
    def ref(self) -> tuple[str, int, int]:
        """(episode_id, session, turn) of the source turn: what y_t labels point at."""
        return (self.episode_id, self.session, self.turn)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of every field (the export record)."""
        d = {name: getattr(self, name) for name in FRAGMENT_FIELDS}
        d["extra"] = dict(self.extra)
        return d


@dataclasses.dataclass(frozen=True)
class MemoryEvent:
    """One change of a fragment: "add", "update" (detail: old_text) or "supersede" (detail: superseded_by).

    `seq` orders a store's events (renumbered by import, which keeps their order); `text` is the fragment's note
    after the event; `by` says who made the change: a decision id, "api", or None.
    """

    seq: int
    user_id: str
    fragment_id: str
    event: str
    at: float
    text: str
    by: str | None = None
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of every field."""
        d = {name: getattr(self, name) for name in EVENT_FIELDS}
        d["detail"] = dict(self.detail)
        return d


def fragment_id_for(user_id: str, episode_id: str, session: int, turn: int) -> str:
    """Deterministic id of the memory saved from one source turn of one user (same turn -> same id).

    Unique while each writer has its own (episode, session): writers sharing a store take sessions from
    `MemoryStore.open_session`."""
    key = json.dumps([user_id, episode_id, int(session), int(turn)], ensure_ascii=False, separators=(",", ":"))
    return "m_" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]


def validate_new(user_id: str, draft: NewFragment, where: str = "memory fragment") -> None:
    """Raise ValueError naming the field when a draft cannot be stored (TextError, naming `where`, the field and
    the offset, for text that is not valid Unicode)."""
    if not isinstance(user_id, str) or not user_id:
        raise ValueError(f"memory fragment: user_id must be a non-empty string, got {user_id!r}")
    check_text(user_id, where, "user_id")
    for name in ("episode_id", "source_text", "text", "policy_version"):
        value = getattr(draft, name)
        if not isinstance(value, str):
            raise ValueError(f"memory fragment: {name} must be a string, got {type(value).__name__}")
        check_text(value, where, name)
    if not draft.episode_id:
        raise ValueError("memory fragment: episode_id must be non-empty")
    if not draft.text.strip():
        raise ValueError(
            f"memory fragment: empty text for {draft.episode_id}/session {draft.session}/turn {draft.turn}"
        )
    for name in ("session", "turn"):
        value = getattr(draft, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"memory fragment: {name} must be an int, got {value!r}")
    if draft.decision_id is not None and not isinstance(draft.decision_id, str):
        raise ValueError(f"memory fragment: decision_id must be a string or None, got {draft.decision_id!r}")
    if draft.decision_id is not None:
        check_text(draft.decision_id, where, "decision_id")
    try:
        json.dumps(dict(draft.extra), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"memory fragment: extra is not JSON-serialisable ({e})") from e

"""The one internal Episode schema: episode -> sessions -> turns, with optional labels.

Every loader converts into these frozen dataclasses and everything downstream reads only them. They go
through TFDS and Grain as plain JSON (``Episode.to_json`` / ``Episode.from_json``), which round-trips
exactly: ``Episode.from_json(e.to_json()) == e``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from icml_jax.data.report import DataError
from icml_jax.textcheck import TextError, check_text

SCHEMA_VERSION = 1

JsonDict = dict[str, Any]


class SchemaError(DataError, ValueError):
    """A plain dict does not describe a valid Episode/Session/Turn (says which field and why)."""


class TurnRef(NamedTuple):
    """Address of one turn inside its episode: ``episode.sessions[session].turns[turn]``."""

    session: int
    turn: int


@dataclasses.dataclass(frozen=True)
class Turn:
    """One utterance, with the optional supervision labels the planner and trigger learn from.

    Attributes:
      speaker: the speaker label as the source writes it ("Speaker 1", "Classmates A", "speaker_1", "user").
      text: the utterance.
      y_p: "worth saving" label for the planner; None where the source has no label.
      y_t: the earlier turns this turn needs (trigger label); None where unlabelled, () for "needs none".
      gold_facts: facts a good reply to this turn must use, as "kind: value" strings (persona world).
      meta: JSON-safe extras that downstream code may ignore (e.g. the persona world's turn kind).
    """

    speaker: str
    text: str
    y_p: bool | None = None
    y_t: tuple[TurnRef, ...] | None = None
    gold_facts: tuple[str, ...] | None = None
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)

    def to_dict(self) -> JsonDict:
        """Plain JSON-safe dict; optional fields that are unset are left out."""
        d: JsonDict = {"speaker": self.speaker, "text": self.text}
        if self.y_p is not None:
            d["y_p"] = self.y_p
        if self.y_t is not None:
            d["y_t"] = [[r.session, r.turn] for r in self.y_t]
        if self.gold_facts is not None:
            d["gold_facts"] = list(self.gold_facts)
        if self.meta:
            d["meta"] = _plain(self.meta)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Turn:
        """Inverse of ``to_dict``; raises SchemaError naming the bad field."""
        _check_keys(d, {"speaker", "text"}, {"y_p", "y_t", "gold_facts", "meta"}, "turn")
        y_t = d.get("y_t")
        gold = d.get("gold_facts")
        y_p = d.get("y_p")
        if y_p is not None and not isinstance(y_p, bool):
            raise SchemaError(f"turn.y_p must be a bool or absent, got {y_p!r}")
        try:
            refs = None if y_t is None else tuple(TurnRef(int(s), int(t)) for s, t in y_t)
        except (TypeError, ValueError) as e:
            raise SchemaError(f"turn.y_t must be a list of [session, turn] pairs, got {y_t!r}") from e
        return cls(
            speaker=_str(d["speaker"], "turn.speaker"),
            text=_str(d["text"], "turn.text"),
            y_p=y_p,
            y_t=refs,
            gold_facts=None if gold is None else tuple(_str(g, "turn.gold_facts[]") for g in gold),
            meta=dict(d.get("meta") or {}),
        )


@dataclasses.dataclass(frozen=True)
class Session:
    """One conversation session and the time that passed before it.

    Attributes:
      turns: the utterances in order.
      gap_seconds: time since the previous session, normalised to seconds; None for the first session or
        where the source gives no (parseable) gap. Vague gaps ("A few hours after") use the convention of
        ``icml_jax.data.timegap``.
      gap_text: the gap exactly as the source writes it ("5 days", "A few weeks after", "Start"), or None.
      summary: a per-session summary where the source has one (Conversation Chronicles).
      meta: JSON-safe extras (e.g. GapChat's per-speaker life events for this session).
    """

    turns: tuple[Turn, ...]
    gap_seconds: float | None = None
    gap_text: str | None = None
    summary: str | None = None
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)

    def to_dict(self) -> JsonDict:
        """Plain JSON-safe dict; optional fields that are unset are left out."""
        d: JsonDict = {"turns": [t.to_dict() for t in self.turns]}
        if self.gap_seconds is not None:
            d["gap_seconds"] = self.gap_seconds
        if self.gap_text is not None:
            d["gap_text"] = self.gap_text
        if self.summary is not None:
            d["summary"] = self.summary
        if self.meta:
            d["meta"] = _plain(self.meta)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Session:
        """Inverse of ``to_dict``; raises SchemaError naming the bad field."""
        _check_keys(d, {"turns"}, {"gap_seconds", "gap_text", "summary", "meta"}, "session")
        gap = d.get("gap_seconds")
        if gap is not None and (isinstance(gap, bool) or not isinstance(gap, (int, float))):
            raise SchemaError(f"session.gap_seconds must be a number or absent, got {gap!r}")
        gap_text = d.get("gap_text")
        summary = d.get("summary")
        return cls(
            turns=tuple(Turn.from_dict(t) for t in _list(d["turns"], "session.turns")),
            gap_seconds=None if gap is None else float(gap),
            gap_text=None if gap_text is None else _str(gap_text, "session.gap_text"),
            summary=None if summary is None else _str(summary, "session.summary"),
            meta=dict(d.get("meta") or {}),
        )


@dataclasses.dataclass(frozen=True)
class Episode:
    """All sessions between the same speakers, plus where they came from.

    Attributes:
      dataset: "msc", "cc", "gapchat", "persona_world", ...
      episode_id: unique within the dataset (the source's id where it has one).
      sessions: the sessions, oldest first.
      relationship: the speakers' relationship where the source has one (Conversation Chronicles).
      personas: speaker -> persona sentences where the source has them (MSC, the persona world).
      meta: JSON-safe extras (source file and record index, MSC init personas, GapChat initial state...).
    """

    dataset: str
    episode_id: str
    sessions: tuple[Session, ...]
    relationship: str | None = None
    personas: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict, hash=False)
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)

    def turn(self, ref: TurnRef | Sequence[int]) -> Turn:
        """The turn a TurnRef points at."""
        s, t = ref
        return self.sessions[s].turns[t]

    @property
    def num_turns(self) -> int:
        """Number of turns over all sessions."""
        return sum(len(s.turns) for s in self.sessions)

    def validate(self) -> Episode:
        """Checks that every y_t points at an existing earlier turn; returns self for chaining."""
        for si, session in enumerate(self.sessions):
            for ti, turn in enumerate(session.turns):
                for ref in turn.y_t or ():
                    if not (0 <= ref.session < len(self.sessions)) or not (
                        0 <= ref.turn < len(self.sessions[ref.session].turns)
                    ):
                        raise SchemaError(f"{self.episode_id}: turn ({si},{ti}) y_t {ref} does not exist")
                    if (ref.session, ref.turn) >= (si, ti):
                        raise SchemaError(f"{self.episode_id}: turn ({si},{ti}) y_t {ref} is not earlier")
        return self

    def to_dict(self) -> JsonDict:
        """Plain JSON-safe dict carrying the schema version."""
        d: JsonDict = {
            "schema_version": SCHEMA_VERSION,
            "dataset": self.dataset,
            "episode_id": self.episode_id,
            "sessions": [s.to_dict() for s in self.sessions],
        }
        if self.relationship is not None:
            d["relationship"] = self.relationship
        if self.personas:
            d["personas"] = {k: list(v) for k, v in self.personas.items()}
        if self.meta:
            d["meta"] = _plain(self.meta)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Episode:
        """Inverse of ``to_dict``; raises SchemaError naming the bad field."""
        _check_keys(
            d,
            {"dataset", "episode_id", "sessions"},
            {"schema_version", "relationship", "personas", "meta"},
            "episode",
        )
        version = d.get("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise SchemaError(f"episode schema_version {version!r}, this code reads {SCHEMA_VERSION}")
        personas = d.get("personas") or {}
        if not isinstance(personas, Mapping):
            raise SchemaError(f"episode.personas must be a mapping, got {type(personas).__name__}")
        relationship = d.get("relationship")
        return cls(
            dataset=_str(d["dataset"], "episode.dataset"),
            episode_id=_str(d["episode_id"], "episode.episode_id"),
            sessions=tuple(Session.from_dict(s) for s in _list(d["sessions"], "episode.sessions")),
            relationship=None if relationship is None else _str(relationship, "episode.relationship"),
            personas={
                _str(k, "episode.personas key"): tuple(_str(x, "episode.personas[]") for x in v)
                for k, v in personas.items()
            },
            meta=dict(d.get("meta") or {}),
        )

    def to_json(self) -> str:
        """Compact, deterministic JSON (sorted keys, UTF-8 kept as is)."""
        return json.dumps(self.to_dict(), ensure_ascii=False, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, s: str | bytes) -> Episode:
        """Inverse of ``to_json``."""
        return cls.from_dict(json.loads(s))


def _plain(x: Any) -> Any:
    """Deep-copies a JSON-like value into plain dicts/lists so to_dict never aliases the dataclass."""
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _check_keys(d: Any, required: set[str], optional: set[str], what: str) -> None:
    """Raises SchemaError when ``d`` is not a mapping, lacks a required key or has an unknown one."""
    if not isinstance(d, Mapping):
        raise SchemaError(f"{what} must be a mapping, got {type(d).__name__}")
    missing = required - d.keys()
    if missing:
        raise SchemaError(f"{what} lacks {sorted(missing)}")
    unknown = d.keys() - required - optional
    if unknown:
        raise SchemaError(f"{what} has unknown keys {sorted(unknown)}")


def _str(x: Any, what: str) -> str:
    """Returns ``x`` if it is a str of valid text, else raises SchemaError naming the field (and the offset)."""
    if not isinstance(x, str):
        raise SchemaError(f"{what} must be a string, got {type(x).__name__}")
    try:
        return check_text(x, "episode", what)
    except TextError as e:
        raise SchemaError(str(e)) from None


def _list(x: Any, what: str) -> Sequence[Any]:
    """Returns ``x`` if it is a list/tuple, else raises SchemaError naming the field."""
    if not isinstance(x, (list, tuple)):
        raise SchemaError(f"{what} must be a list, got {type(x).__name__}")
    return x

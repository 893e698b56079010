"""Validating LLM answers of the synthesis into the Episode schema; an unusable answer raises MalformedOutput."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from icml_jax.data.schema import Session, Turn, TurnRef
from icml_jax.synthesis.prompts import SYNTH_ROLES
from icml_jax.llm.types import LLMResponse
from icml_jax.textcheck import TextError, check_text

USER, ASSISTANT = SYNTH_ROLES


class MalformedOutput(ValueError):
    """An answer that cannot be used as asked (the message says what is wrong); it is re-asked, then skipped."""


@dataclasses.dataclass(frozen=True)
class WrittenSession:
    """A parsed writer answer: the session (dataset speaker labels) and the time until the next session (a sequel's
    time since the previous one is stored on that previous session)."""

    session: Session
    gap_to_next: str | None


@dataclasses.dataclass(frozen=True)
class TurnLabel:
    """A parsed annotation of one user turn: information gain in [0, 1] and the earlier turns it needs."""

    gain: float
    needs: tuple[TurnRef, ...]


def _object(response: LLMResponse) -> dict[str, Any]:
    if response.parse_error is not None:
        raise MalformedOutput(f"not JSON: {response.parse_error}")
    if not isinstance(response.parsed, dict):
        raise MalformedOutput(f"expected a JSON object, got {type(response.parsed).__name__}")
    return response.parsed


def _int(x: Any, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or int(x) != x:
        raise MalformedOutput(f"{what} must be an integer, got {x!r}")
    return int(x)


def _valid_text(value: str, what: str) -> None:
    """MalformedOutput naming `what` and the offset when a written text is not valid Unicode (a lone surrogate)."""
    try:
        check_text(value, "written session", what)
    except TextError as e:
        raise MalformedOutput(str(e)) from None


def parse_session(
    response: LLMResponse,
    *,
    user_speaker: str,
    assistant_speaker: str,
    max_turns: int,
    want_gap: bool,
    gap_key: str = "gap_to_next",
) -> WrittenSession:
    """A written session: 1..max_turns turns, speakers 'user'/'assistant', non-empty texts, at least one user turn;
    with `want_gap`, a non-empty `gap_key` string (a prequel's "gap_to_next", a sequel's "gap_since_previous")."""
    obj = _object(response)
    turns = obj.get("turns")
    if not isinstance(turns, list) or not turns:
        raise MalformedOutput("'turns' must be a non-empty list")
    if len(turns) > max_turns:
        raise MalformedOutput(f"{len(turns)} turns, more than max_turns_per_session={max_turns}")
    out = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise MalformedOutput(f"turns[{i}] must be an object, got {type(t).__name__}")
        speaker, text = t.get("speaker"), t.get("text")
        role = speaker.strip().lower() if isinstance(speaker, str) else None
        if role not in SYNTH_ROLES:
            raise MalformedOutput(f"turns[{i}].speaker must be 'user' or 'assistant', got {speaker!r}")
        if not isinstance(text, str) or not text.strip():
            raise MalformedOutput(f"turns[{i}].text must be a non-empty string")
        _valid_text(text, f"turns[{i}].text")
        out.append(Turn(user_speaker if role == USER else assistant_speaker, text.strip()))
    if not any(t.speaker == user_speaker for t in out):
        raise MalformedOutput("the session has no user turn")
    gap = obj.get(gap_key)
    if want_gap and (not isinstance(gap, str) or not gap.strip()):
        raise MalformedOutput(f"'{gap_key}' must be a non-empty string, got {gap!r}")
    if want_gap:
        _valid_text(gap, f"'{gap_key}'")
    return WrittenSession(Session(tuple(out)), gap.strip() if want_gap else None)


def parse_labels(
    response: LLMResponse,
    sessions: Sequence[Session],
    current: int,
    *,
    user_speaker: str,
) -> dict[int, TurnLabel]:
    """Labels of every user turn of `sessions[current]`; needs must be existing turns strictly before the turn.

    Labels given for assistant turns are ignored (the annotator is asked for user turns only); a missing,
    duplicated or out-of-range label is malformed.
    """
    obj = _object(response)
    items = obj.get("labels")
    if not isinstance(items, list):
        raise MalformedOutput("'labels' must be a list")
    session = sessions[current]
    user_turns = {i for i, t in enumerate(session.turns) if t.speaker == user_speaker}
    out: dict[int, TurnLabel] = {}
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise MalformedOutput(f"labels[{k}] must be an object")
        turn = _int(item.get("turn"), f"labels[{k}].turn")
        if not 0 <= turn < len(session.turns):
            raise MalformedOutput(f"labels[{k}].turn {turn} is not a turn of session {current}")
        if turn not in user_turns:
            continue
        if turn in out:
            raise MalformedOutput(f"turn {turn} labelled twice")
        gain = item.get("gain")
        if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not 0.0 <= float(gain) <= 1.0:
            raise MalformedOutput(f"labels[{k}].gain must be a number in [0, 1], got {gain!r}")
        needs = item.get("needs", [])
        if not isinstance(needs, list):
            raise MalformedOutput(f"labels[{k}].needs must be a list")
        refs = []
        for j, n in enumerate(needs):
            if not isinstance(n, dict):
                raise MalformedOutput(f"labels[{k}].needs[{j}] must be an object {{session, turn}}")
            ref = TurnRef(_int(n.get("session"), f"labels[{k}].needs[{j}].session"),
                          _int(n.get("turn"), f"labels[{k}].needs[{j}].turn"))
            if not (0 <= ref.session <= current and 0 <= ref.turn < len(sessions[ref.session].turns)):
                raise MalformedOutput(f"labels[{k}].needs[{j}] {tuple(ref)} is not a turn shown")
            if (ref.session, ref.turn) >= (current, turn):
                raise MalformedOutput(f"labels[{k}].needs[{j}] {tuple(ref)} is not earlier than turn {turn}")
            if ref not in refs:
                refs.append(ref)
        out[turn] = TurnLabel(float(gain), tuple(refs))
    missing = sorted(user_turns - set(out))
    if missing:
        raise MalformedOutput(f"user turn(s) {missing} of session {current} have no label")
    return out

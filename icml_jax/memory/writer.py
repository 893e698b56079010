"""Saving turns: condense each saved user turn through an LLM back end, then append the notes to the store."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from icml_jax.llm.generation import NOTE_MAX_TOKENS, CondenseInput, Condensed, condense_turns
from icml_jax.llm.prompts import Dialogue
from icml_jax.llm.types import LLMBackend
from icml_jax.memory.fragment import Fragment, NewFragment
from icml_jax.memory.store import MemoryStore


@dataclasses.dataclass(frozen=True)
class TurnToSave:
    """A user turn the Planner chose to save, with its provenance and the id of that save decision."""

    episode_id: str
    session: int
    turn: int
    text: str
    history: Dialogue = ()
    decision_id: str | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def condense(backend: LLMBackend, turns: Sequence[TurnToSave], *,
             max_output_tokens: int = NOTE_MAX_TOKENS) -> list[Condensed]:
    """The notes `save_turns` stores for `turns` (one batched back-end call). The synthesis condenses the expert
    data's memories with it too, so the warm-up trains on the memories the Trigger sees online."""
    return condense_turns(backend, [CondenseInput(t.text, t.history) for t in turns],
                          max_output_tokens=max_output_tokens)


def save_turns(
    store: MemoryStore,
    backend: LLMBackend,
    user_id: str,
    turns: Sequence[TurnToSave],
    *,
    policy_version: str,
    note_max_tokens: int = NOTE_MAX_TOKENS,
) -> list[Fragment]:
    """Condense `turns` (one batched back-end call, outside any DB lock) and append them in one transaction.

    The returned fragments are the save receipts: `fragment_id` keys the Pending Reward Buffer, `decision_id`
    points back at the save decision, `ref` matches y_t labels. A condensation that fell back to the turn text is
    marked `extra['condense_fallback'] = True`.
    """
    if not turns:
        return []
    condensed = condense(backend, turns, max_output_tokens=note_max_tokens)
    drafts = []
    for t, c in zip(turns, condensed, strict=True):
        extra = dict(t.extra)
        if c.fallback:
            extra["condense_fallback"] = True
        drafts.append(
            NewFragment(
                episode_id=t.episode_id,
                session=t.session,
                turn=t.turn,
                source_text=t.text,
                text=c.text,
                policy_version=str(policy_version),
                decision_id=t.decision_id,
                extra=extra,
            )
        )
    return store.append_many(user_id, drafts)

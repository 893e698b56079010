"""Saving turns: condense each saved user turn through an LLM back end, then append the notes to the store.

Supersede (`supersede` > 0): the condense request also shows the user's most similar current memories, numbered;
the writer may end its note with a line `REPLACES: 2, 3` naming the ones the new turn makes outdated ("I moved to
Berlin" replaces "lives in Paris"). Only numbers of memories shown in that request count (a note cannot name any
other memory, whatever the turn's text says), and the memories shown are that user's own (`MemoryStore.top_k` is
scoped to the user): a turn may retire its user's shown memories by asking, in any words, which is the user's own
business, but never another user's or an unshown one. Those memories stay in the store with `superseded_by` /
`valid_to` and leave the Trigger's candidates. The offline back end answers from the turn's label (`label['supersedes']`,
the persona world's overwritten fact) and the shown memories' labels.
"""

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


def _label(extra: Mapping[str, Any]) -> Mapping[str, Any]:
    label = extra.get("label")
    return label if isinstance(label, Mapping) else {}


def condense(backend: LLMBackend, turns: Sequence[TurnToSave], *, max_output_tokens: int = NOTE_MAX_TOKENS,
             shown: Sequence[Sequence[Fragment]] | None = None) -> list[Condensed]:
    """The notes `save_turns` stores for `turns` (one batched back-end call). The synthesis condenses the expert
    data's memories with it too, so the warm-up trains on the memories the Trigger sees online. `shown[i]`: the
    stored memories turn i's request offers for replacement (supersede)."""
    shown = shown or [()] * len(turns)
    items = []
    for t, mems in zip(turns, shown, strict=True):
        metadata = None
        if mems:  # the offline back end replaces from labels: the turn's overwritten fact, the memories' facts
            metadata = {"supersedes": _label(t.extra).get("supersedes"),
                        "memory_facts": [_label(m.extra).get("fact") for m in mems]}
        items.append(CondenseInput(t.text, t.history, metadata=metadata, memories=tuple(m.text for m in mems)))
    return condense_turns(backend, items, max_output_tokens=max_output_tokens)


def save_turns(
    store: MemoryStore,
    backend: LLMBackend,
    user_id: str,
    turns: Sequence[TurnToSave],
    *,
    policy_version: str,
    note_max_tokens: int = NOTE_MAX_TOKENS,
    supersede: int = 0,
) -> list[Fragment]:
    """Condense `turns` (one batched back-end call, outside any DB lock) and append them in one transaction.

    The returned fragments are the save receipts: `fragment_id` keys the Pending Reward Buffer, `decision_id`
    points back at the save decision, `ref` matches y_t labels. A condensation that fell back to the turn text is
    marked `extra['condense_fallback'] = True`; a first note the check rejected, `extra['note_problem']`. With
    `supersede` > 0 the request shows that many of the user's most similar current memories, and those the note
    replaces are superseded by the new fragment; they are listed in its `extra['replaces']` ([{"id", "ref"}]).
    """
    if not turns:
        return []
    shown = shown_for(store, user_id, turns, supersede)
    condensed = condense(backend, turns, max_output_tokens=note_max_tokens, shown=shown)
    return commit_saves(store, user_id, turns, condensed, shown, policy_version=policy_version)


def note_counts(condensed: Sequence[Condensed], counts: dict[str, Any] | None = None) -> dict[str, Any]:
    """Adds `condensed`'s note-check outcomes to `counts` ({"notes", "rewritten", "fallback", "problems": {reason
    kind: n}}, made when None) and returns it: how often a writer's first note was rejected, and why."""
    counts = counts if counts is not None else {"notes": 0, "rewritten": 0, "fallback": 0, "problems": {}}
    for c in condensed:
        counts["notes"] += 1
        counts["rewritten"] += int(c.rewritten)
        counts["fallback"] += int(c.fallback)
        if c.problem:
            kind = c.problem.split(' (')[0].split(' "')[0]  # "echoes the prompt", "repeats", "is empty", ...
            counts["problems"][kind] = counts["problems"].get(kind, 0) + 1
    return counts


def shown_for(store: MemoryStore, user_id: str, turns: Sequence[TurnToSave], supersede: int) -> list[list[Fragment]]:
    """The memories each turn's condense request offers for replacement (read before the request is sent, so a
    caller can send it from another thread while the store stays on its own)."""
    if supersede <= 0:
        return [[] for _ in turns]
    return [store.top_k(user_id, t.text, supersede) for t in turns]  # current memories only; [] when none


def commit_saves(store: MemoryStore, user_id: str, turns: Sequence[TurnToSave], condensed: Sequence[Condensed],
                 shown: Sequence[Sequence[Fragment]], *, policy_version: str) -> list[Fragment]:
    """Appends the condensed notes of `turns` in one transaction and applies their supersedes (the store writes
    of `save_turns`)."""
    drafts, replaced = [], []
    for t, c, mems in zip(turns, condensed, shown, strict=True):
        extra = dict(t.extra)
        replaced.append([mems[k] for k in c.replaces])
        if replaced[-1]:
            extra["replaces"] = [{"id": f.fragment_id, "ref": list(f.ref)} for f in replaced[-1]]
        if c.fallback:
            extra["condense_fallback"] = True
        if c.problem:  # the note check rejected the first note (it was asked again; see `fallback`)
            extra["note_problem"] = c.problem
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
    fragments = store.append_many(user_id, drafts)
    for frag, old in zip(fragments, replaced, strict=True):
        if old:
            store.supersede(user_id, [f.fragment_id for f in old], frag.fragment_id, by=frag.decision_id)
    return fragments

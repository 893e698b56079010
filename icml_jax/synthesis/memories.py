"""The expert data's memories as the online agent stores them: condensed notes, not raw turn texts.

Online, a saved turn becomes a memory through the memory writer (`icml_jax.memory.writer`): the generator back
end condenses it, with the recent dialogue, into a short note, and the Trigger reads that note. The synthesis
condenses every turn its expert data uses as a memory (the Trigger examples' candidates, and the turns the
expert saves, y_p) with the same writer and back end, so the warm-up trains on what the Trigger later sees.
Notes go into the candidates (the turn text stays as `source_text`) and into the episodes' turns
(`meta["memory"]`). A negative whose note reads like its example's positive note is dropped: two turns that
condense to the same note would make the label ambiguous.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from icml_jax.data.schema import Episode, TurnRef
from icml_jax.llm.types import LLMBackend
from icml_jax.memory.writer import TurnToSave, condense
from icml_jax.synthesis.examples import TriggerExample

MEMORY_KEY = "memory"  # Turn.meta key of a condensed note

Key = tuple[str, TurnRef]  # (episode id, turn)


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def memory_turns(episodes: Sequence[Episode], examples: Sequence[TriggerExample], user_speaker: str) -> list[Key]:
    """The turns that are memories in the expert data, in a stable order: every Trigger candidate and every user
    turn the expert saves (y_p)."""
    keys: dict[Key, None] = {}
    for ex in examples:
        for c in ex.candidates:
            keys[(c.episode_id, TurnRef(*c.ref))] = None
    for ep in episodes:
        for s, session in enumerate(ep.sessions):
            for t, turn in enumerate(session.turns):
                if turn.speaker == user_speaker and turn.y_p:
                    keys[(ep.episode_id, TurnRef(s, t))] = None
    return list(keys)


def condense_memories(episodes: Sequence[Episode], keys: Sequence[Key], backend: LLMBackend, *,
                      batch_size: int, max_output_tokens: int = 128) -> dict[Key, tuple[str, bool]]:
    """{(episode id, turn): (note, fell back to the turn text)} from the memory writer's condensation: the turn
    with its session's dialogue before it, as the online agent saves it. Identical inputs are asked once."""
    by_id = {ep.episode_id: ep for ep in episodes}
    todo: dict[tuple[str, tuple[tuple[str, str], ...]], TurnToSave] = {}
    which: dict[Key, tuple[str, tuple[tuple[str, str], ...]]] = {}
    for episode_id, ref in keys:
        ep = by_id.get(episode_id)
        if ep is None:
            raise KeyError(f"condense_memories: memory {episode_id}/{tuple(ref)} names an episode not given")
        session = ep.sessions[ref.session]
        history = tuple((t.speaker, t.text) for t in session.turns[: ref.turn])
        text = session.turns[ref.turn].text
        inputs = (text, history)
        which[(episode_id, ref)] = inputs
        todo.setdefault(inputs, TurnToSave(episode_id, ref.session, ref.turn, text, history))
    unique = list(todo)
    notes: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, bool]] = {}
    for start in range(0, len(unique), batch_size):
        chunk = unique[start:start + batch_size]
        for inputs, c in zip(chunk, condense(backend, [todo[i] for i in chunk],
                                                  max_output_tokens=max_output_tokens), strict=True):
            notes[inputs] = (c.text, c.fallback)
    return {key: notes[inputs] for key, inputs in which.items()}


def episodes_with_memories(episodes: Sequence[Episode], notes: Mapping[Key, tuple[str, bool]]) -> list[Episode]:
    """The episodes with each condensed turn's note in `turn.meta["memory"]`."""
    out = []
    for ep in episodes:
        sessions = []
        for s, session in enumerate(ep.sessions):
            turns = tuple(
                dataclasses.replace(turn, meta={**turn.meta, MEMORY_KEY: notes[(ep.episode_id, TurnRef(s, t))][0]})
                if (ep.episode_id, TurnRef(s, t)) in notes else turn
                for t, turn in enumerate(session.turns))
            sessions.append(dataclasses.replace(session, turns=turns))
        out.append(dataclasses.replace(ep, sessions=tuple(sessions)))
    return out


def examples_with_memories(examples: Sequence[TriggerExample],
                           notes: Mapping[Key, tuple[str, bool]]) -> tuple[list[TriggerExample], int]:
    """The examples with every candidate's text replaced by its note (turn text kept as `source_text`), negatives
    whose note equals the positive's dropped; returns (examples, negatives dropped)."""
    out, dropped = [], 0
    for ex in examples:
        cands = []
        for c in ex.candidates:
            key = (c.episode_id, TurnRef(*c.ref))
            if key not in notes:
                raise KeyError(f"examples_with_memories: no note for candidate {c.episode_id}/{tuple(c.ref)} of "
                               f"example {ex.example_id}")
            cands.append(dataclasses.replace(c, text=notes[key][0], source_text=c.text))
        positive = cands[ex.target - 1] if ex.target else None
        kept = [c for c in cands if positive is None or c is positive or _norm(c.text) != _norm(positive.text)]
        dropped += len(cands) - len(kept)
        target = 0 if positive is None else 1 + next(i for i, c in enumerate(kept) if c is positive)
        out.append(dataclasses.replace(ex, candidates=tuple(kept), target=target))
    return out, dropped


def condense_expert_data(episodes: Sequence[Episode], examples: Sequence[TriggerExample], backend: LLMBackend, *,
                         user_speaker: str, batch_size: int, max_output_tokens: int = 128,
                         ) -> tuple[list[Episode], list[TriggerExample], dict[str, Any]]:
    """One split's episodes and Trigger examples with condensed memories, and counts for the manifest."""
    keys = memory_turns(episodes, examples, user_speaker)
    notes = condense_memories(episodes, keys, backend, batch_size=batch_size, max_output_tokens=max_output_tokens)
    new_examples, dropped = examples_with_memories(examples, notes)
    stats = {"memories": len(notes), "fallbacks": sum(fb for _, fb in notes.values()),
             "negatives_dropped_as_duplicates": dropped}
    return episodes_with_memories(episodes, notes), new_examples, stats


__all__ = ["MEMORY_KEY", "condense_expert_data", "condense_memories", "episodes_with_memories",
           "examples_with_memories", "memory_turns"]

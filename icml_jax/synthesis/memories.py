"""The expert data's memories as the online agent stores them: condensed notes, not raw turn texts.

Online, a saved turn becomes a memory through the memory writer (`icml_jax.memory.writer`): the generator back
end condenses it, with the recent dialogue, into a short note, and the Trigger reads that note. The synthesis
condenses every turn its expert data uses as a memory (the Trigger examples' candidates, and the turns the
expert saves, y_p) with the same writer and back end, so the warm-up trains on what the Trigger later sees.
Notes go into the candidates (the turn text stays as `source_text`) and into the episodes' turns
(`meta["memory"]`). A negative whose note reads like its example's positive note is dropped: two turns that
condense to the same note would make the label ambiguous. A condensation the back end fails for good (retries
exhausted) keeps the turn text as the note, as an empty answer does, and is counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from icml_jax.data.schema import Episode, TurnRef
from icml_jax.llm.generation import CondenseInput, condense_turns
from icml_jax.llm.types import LLMBackend
from icml_jax.memory.writer import TurnToSave
from icml_jax.synthesis.examples import TriggerExample
from icml_jax.synthesis.storylines import RequestStats

MEMORY_KEY = "memory"  # Turn.meta key of a condensed note

Key = tuple[str, TurnRef]  # (episode id, turn)


class Note(NamedTuple):
    """A memory's note, whether it fell back to the turn text, and why its request failed (None: it did not)."""

    text: str
    fallback: bool
    error: str | None = None


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
                      batch_size: int, max_output_tokens: int = 128) -> tuple[dict[Key, Note], RequestStats]:
    """({(episode id, turn): Note}, what asking cost) from the memory writer's condensation: the turn with its
    session's dialogue before it, as the online agent saves it (`memory.writer.condense`'s requests; a request
    that fails for good keeps the turn text and is counted). Identical inputs are asked once."""
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
    stats = RequestStats(requests=len(unique), attempts=len(unique))
    notes: dict[tuple[str, tuple[tuple[str, str], ...]], Note] = {}
    for start in range(0, len(unique), batch_size):
        chunk = unique[start:start + batch_size]
        # the requests memory.writer.condense sends, with failures handed back instead of raised
        condensed = condense_turns(backend, [CondenseInput(todo[i].text, todo[i].history) for i in chunk],
                                   max_output_tokens=max_output_tokens, skip_failures=True)
        stats.calls += 1
        for inputs, c in zip(chunk, condensed, strict=True):
            notes[inputs] = Note(c.text, c.fallback, c.error)
            if c.error is not None:
                stats.failed += 1
                stats.first_failure = stats.first_failure or c.error
    return {key: notes[inputs] for key, inputs in which.items()}, stats


def episodes_with_memories(episodes: Sequence[Episode], notes: Mapping[Key, Note]) -> list[Episode]:
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
                           notes: Mapping[Key, Note]) -> tuple[list[TriggerExample], int]:
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
                         ) -> tuple[list[Episode], list[TriggerExample], dict[str, Any], RequestStats]:
    """One split's episodes and Trigger examples with condensed memories, counts for the manifest, and what
    asking cost (requests, failures)."""
    keys = memory_turns(episodes, examples, user_speaker)
    notes, asked = condense_memories(episodes, keys, backend, batch_size=batch_size,
                                     max_output_tokens=max_output_tokens)
    new_examples, dropped = examples_with_memories(examples, notes)
    stats = {"memories": len(notes), "fallbacks": sum(n.fallback for n in notes.values()),
             "negatives_dropped_as_duplicates": dropped, "requests": asked.requests, "failed": asked.failed}
    return episodes_with_memories(episodes, notes), new_examples, stats, asked


__all__ = ["MEMORY_KEY", "Note", "condense_expert_data", "condense_memories", "episodes_with_memories",
           "examples_with_memories", "memory_turns"]

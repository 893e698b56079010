"""A-Mem-style memory, after Xu et al., "A-MEM: Agentic Memory for LLM Agents" (2025): Zettelkasten-like notes
with keywords, tags and a context, linked to related notes, which evolve as new notes arrive.

At every turn the agent acts on, one LLM call (`prompts.amem_note_request`, with the recent dialogue) decides
whether the turn is worth keeping and describes it: at most `baselines.a_mem.max_keywords` keywords, tags and a
one-sentence context. A kept turn becomes a note (its content is the turn; `saved` is True). Its candidate
neighbours are the `a_mem.link_k` stored notes most similar to it (the note's content, keywords, tags and
context as one text; cosine of embeddings or BM25, `a_mem.relevance`; with BM25 only notes sharing a word). When
there are candidates, a second call (`prompts.amem_evolve_request`) decides the links -- the LINK DECISION IS
THE LLM'S, not a similarity threshold -- and the evolution: each linked note may get a new context and / or new
tags. Links are kept both ways, so a note's neighbours include the later notes that linked to it. A reply gets
the top-k (`baselines.top_k`) notes by similarity to the utterance, then the linked neighbours of each (at most
`a_mem.neighbours` per note, the most recently linked first, none twice); a note is shown as its content and,
when it has one, its context in brackets. Simplified: the note's timestamp and the paper's separate "strengthen"
action are left out (the links the LLM chooses are the connections), retrieval is over the note's text rather
than a dedicated embedding of all fields, and evolution updates context and tags only (never the content).

Malformed answers are counted per task (`malformed`) and fall back visibly: an unusable note answer keeps the
turn as a note without keywords, tags or context (nothing is dropped); a usable one with bad fields keeps what
is usable (a missing keep means keep); an unusable evolution answer links nothing and evolves nothing; links or
updates of notes that were not shown are ignored (each counted).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from icml_jax.baselines import prompts
from icml_jax.baselines.common import (
    NO_MEMORY,
    BaselineAgent,
    Query,
    Recalled,
    Ref,
    ReplySettings,
    baseline_settings,
    choice_of,
    user_speaker_of,
)
from icml_jax.baselines.encoder import DenseRelevance, LexicalRelevance, relevance_from, top_indices
from icml_jax.data.schema import Episode
from icml_jax.evaluation.protocol import MemoryChoice
from icml_jax.llm.types import LLMBackend


@dataclasses.dataclass
class Note:
    """One A-Mem note: the turn, its fields (which evolve), its links (note ids, oldest first) and source turn."""

    note_id: str
    content: str
    fields: prompts.NoteFields
    refs: tuple[Ref, ...]
    links: list[str] = dataclasses.field(default_factory=list)

    def index_text(self) -> str:
        """The text the note is retrieved by: content, keywords, tags and context."""
        return " ".join([self.content, *self.fields.keywords, *self.fields.tags, self.fields.context]).strip()

    def shown(self) -> str:
        """The note as a reply sees it."""
        return f"{self.content} ({self.fields.context})" if self.fields.context else self.content

    def recalled(self) -> Recalled:
        return Recalled(self.note_id, self.shown(), self.refs)


class AMemAgent(BaselineAgent):
    """Per-user linked notes that evolve (see the module docstring)."""

    kind = "a_mem"

    def __init__(self, generator: LLMBackend, relevance: DenseRelevance | LexicalRelevance, *,
                 user_speaker: str | None, top_k: int = 3, link_k: int = 5, neighbours: int = 2,
                 max_keywords: int = 5, note_max_tokens: int = 256, evolve_max_tokens: int = 256,
                 reply: ReplySettings | None = None) -> None:
        super().__init__(generator, user_speaker=user_speaker, reply=reply)
        if top_k < 1 or link_k < 0 or neighbours < 0 or max_keywords < 1:
            raise ValueError(f"a_mem: top_k and max_keywords must be >= 1, link_k and neighbours >= 0, got {top_k}, "
                             f"{max_keywords}, {link_k}, {neighbours}")
        self.relevance, self.top_k, self.link_k, self.neighbours = relevance, top_k, link_k, neighbours
        self.max_keywords, self.note_max_tokens, self.evolve_max_tokens = max_keywords, note_max_tokens, \
            evolve_max_tokens
        self.notes: dict[str, dict[str, Note]] = {}
        self._next: dict[str, int] = {}
        self.stats = {"notes": 0, "skipped": 0, "links": 0, "evolved": 0}

    def forget_all(self) -> None:
        self.notes.clear()
        self._next.clear()
        self.relevance.forget()

    def memory_texts(self, user_id: str) -> list[str]:
        return [n.shown() for n in self.notes.get(user_id, {}).values()]

    def construct(self, user_id: str, episode: Episode, session: int, turn: int,
                  history: Sequence[tuple[str, str]]) -> bool:
        """The note call; a kept turn becomes a note, then links and evolution among its candidates."""
        text = episode.sessions[session].turns[turn].text
        (resp,) = self.generator.generate([prompts.amem_note_request(
            text, context=tuple(map(tuple, history)), max_keywords=self.max_keywords,
            max_output_tokens=self.note_max_tokens)])
        parsed, problem = prompts.parse_note(resp)
        if problem:
            self.count_malformed(prompts.TASK_AMEM_NOTE, problem)
        keep, fields = parsed if parsed is not None else (True, prompts.NoteFields((), (), ""))
        if not keep:
            self.stats["skipped"] += 1
            return False
        fields = dataclasses.replace(fields, keywords=fields.keywords[: self.max_keywords])
        bank = self.notes.setdefault(user_id, {})
        n = self._next.get(user_id, 0)
        self._next[user_id] = n + 1
        note = Note(f"amem-{n}", text, fields, ((episode.episode_id, session, turn),))
        candidates = self._ranked(note.index_text(), list(bank.values()), self.link_k)
        bank[note.note_id] = note
        self.stats["notes"] += 1
        if candidates:
            self._evolve(note, candidates, bank)
        return True

    def _ranked(self, query: str, items: Sequence[Note], k: int) -> list[Note]:
        """The (at most) k notes most similar to `query`, best first."""
        if not items or k <= 0:
            return []
        (row,) = self.relevance.scores([query], [m.index_text() for m in items])
        return [items[i] for i in top_indices(row, k, positive_only=self.relevance.positive_only)]

    def _evolve(self, note: Note, candidates: Sequence[Note], bank: dict[str, Note]) -> None:
        """The link and evolution call for a new note, applied (links both ways)."""
        ids = [str(i) for i in range(len(candidates))]
        (resp,) = self.generator.generate([prompts.amem_evolve_request(
            note.content, note.fields, [(i, c.content, c.fields) for i, c in zip(ids, candidates, strict=True)],
            max_output_tokens=self.evolve_max_tokens)])
        parsed, problem = prompts.parse_evolution(resp, ids)
        if problem:
            self.count_malformed(prompts.TASK_AMEM_EVOLVE, problem)
        if parsed is None:
            return
        links, updates = parsed
        for i in links:
            other = candidates[int(i)]
            note.links.append(other.note_id)
            other.links.append(note.note_id)
            self.stats["links"] += 1
        for i, (context, tags) in updates.items():
            other = bank[candidates[int(i)].note_id]
            new = dataclasses.replace(other.fields, context=context or other.fields.context,
                                      tags=tags or other.fields.tags)
            if new != other.fields:
                other.fields = new
                self.stats["evolved"] += 1

    def recall(self, user_id: str, queries: Sequence[Query], *, final: bool) -> list[MemoryChoice]:
        """Top-k notes by similarity, then their linked neighbours; every query scored in one call."""
        bank = self.notes.get(user_id, {})
        items = list(bank.values())
        if not items:
            return [NO_MEMORY for _ in queries]
        scores = self.relevance.scores([q.utterance for q in queries], [m.index_text() for m in items])
        out = []
        for row in scores:
            top = [items[i] for i in top_indices(row, self.top_k, positive_only=self.relevance.positive_only)]
            shown = {n.note_id: n for n in top}
            for n in top:
                linked = [bank[i] for i in reversed(n.links) if i not in shown]
                shown.update((m.note_id, m) for m in linked[: self.neighbours])
            out.append(choice_of([m.recalled() for m in shown.values()]))
        return out

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(), "top_k": self.top_k, "link_k": self.link_k, "neighbours": self.neighbours,
                "max_keywords": self.max_keywords, "link_decision": "llm", "stats": self.stats,
                **self.relevance.provenance()}


def build(ctx: Any) -> tuple[AMemAgent, dict[str, Any]]:
    """The agent for an `EvalContext`."""
    settings = baseline_settings(ctx.config)
    block = settings["a_mem"]
    agent = AMemAgent(ctx.generator, relevance_from(block["relevance"], settings, ctx),
                      user_speaker=user_speaker_of(ctx.config), top_k=int(settings["top_k"]),
                      link_k=int(block["link_k"]), neighbours=int(block["neighbours"]),
                      max_keywords=int(block["max_keywords"]), note_max_tokens=int(block["note_max_tokens"]),
                      evolve_max_tokens=int(block["evolve_max_tokens"]), reply=ReplySettings.from_config(ctx.config))
    return agent, agent.provenance()

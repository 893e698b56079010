"""LD-Agent-style memory, after Li et al., "Hello Again! LLM-powered Personalized Agent for Long-term Dialogue"
(NAACL 2025): a long-term event memory of per-session summaries, retrieved by topic-aware relevance, and the
personas of both speakers, accumulated across sessions.

The current session is the short-term context (the gold history in the reply prompt). Once an earlier session
is over, one back-end call carries two requests: its event summary (`prompts.summarize_request`, the
memory's event record, citing the session's acted turns) and both speakers' persona traits
(`prompts.ld_persona_request`; the user's are the turns the agent acts on, the agent's the other turns), at most
`baselines.ld_agent.max_traits` each, every trait with the turn it came from. Traits accumulate per speaker
(an identical text is kept once, its newest source first). A reply gets the top-k (`baselines.top_k`) events by

    score = (relevance + topic_weight * topic overlap) * exp(-sessions since the event / recency_tau)

where relevance is the cosine of embeddings mapped to [0, 1] ((1 + cos) / 2) or BM25 divided by the row's best
(`ld_agent.relevance`), and topic overlap is the share of the query's content words (`memory.lexical.tokenize`)
that the event's summary holds: the paper's noun-based topic matching, without a part-of-speech tagger. With
BM25 an event sharing no word is never shown. After the events come the user's and the agent's persona (the
newest `ld_agent.persona_shown` traits each), so the reply sees the retrieved events and both personas.
Simplified: personas are extracted once per session rather than per utterance, there is no separate retrieval
threshold, and there is no per-turn save decision (`saved` is None).

Malformed answers are counted per task (`malformed`) and fall back visibly: an empty summary becomes the
session's acted turns joined; an unusable persona answer adds no trait for that session (counted); a trait
whose turn id is not one of its speaker's turns in the session is kept without a source turn (counted).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

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
from icml_jax.llm.generation import drop_repeated_sentences
from icml_jax.llm.types import LLMBackend
from icml_jax.memory.lexical import tokenize


@dataclasses.dataclass(frozen=True)
class Event:
    """One session's event summary, its content words (the topic) and the acted turns it covers."""

    memory_id: str
    text: str
    topics: frozenset[str]
    refs: tuple[Ref, ...]
    session: int


@dataclasses.dataclass
class Trait:
    """One persona trait of a speaker and the turns it was said in (the newest first)."""

    text: str
    refs: tuple[Ref, ...]


def topic_overlap(query: str, topics: frozenset[str]) -> float:
    """The share of the query's content words that `topics` holds (0 for a query without content words)."""
    words = set(tokenize(query))
    return len(words & topics) / len(words) if words else 0.0


class LDAgent(BaselineAgent):
    """Per-user event summaries and both speakers' personas (see the module docstring)."""

    kind = "ld_agent"

    def __init__(self, generator: LLMBackend, relevance: DenseRelevance | LexicalRelevance, *,
                 user_speaker: str | None, top_k: int = 3, topic_weight: float = 1.0, recency_tau: float = 10.0,
                 max_traits: int = 5, persona_shown: int = 10, summary_max_tokens: int = 192,
                 persona_max_tokens: int = 256, reply: ReplySettings | None = None) -> None:
        super().__init__(generator, user_speaker=user_speaker, reply=reply)
        if top_k < 1 or max_traits < 1 or persona_shown < 0 or topic_weight < 0 or recency_tau <= 0:
            raise ValueError(f"ld_agent: top_k and max_traits must be >= 1, persona_shown and topic_weight >= 0 "
                             f"and recency_tau > 0, got {top_k}, {max_traits}, {persona_shown}, {topic_weight}, "
                             f"{recency_tau}")
        self.relevance, self.top_k, self.topic_weight, self.recency_tau = relevance, top_k, topic_weight, recency_tau
        self.max_traits, self.persona_shown = max_traits, persona_shown
        self.summary_max_tokens, self.persona_max_tokens = summary_max_tokens, persona_max_tokens
        self.events: dict[str, list[Event]] = {}
        self.personas: dict[str, dict[str, list[Trait]]] = {}  # user -> speaker ("user" | "agent") -> traits
        self.stats = {"events": 0, "user_traits": 0, "agent_traits": 0}

    def forget_all(self) -> None:
        self.events.clear()
        self.personas.clear()
        self.relevance.forget()

    def memory_texts(self, user_id: str) -> list[str]:
        traits = self.personas.get(user_id, {})
        return [e.text for e in self.events.get(user_id, [])] + [
            t.text for speaker in prompts.PERSONA_SPEAKERS for t in traits.get(speaker, [])]

    def end_session(self, user_id: str, episode: Episode, session: int) -> None:
        """The session's event summary and both speakers' traits (one back-end call with both requests)."""
        turns = [(t, turn.speaker, turn.text, self.acts_on(episode, session, t))
                 for t, turn in enumerate(episode.sessions[session].turns)]
        ref = lambda t: (episode.episode_id, session, t)  # noqa: E731
        acted = [(t, text) for t, _, text, user in turns if user]
        summary_resp, persona_resp = self.generator.generate([
            prompts.summarize_request(turns, session=session, max_output_tokens=self.summary_max_tokens),
            prompts.ld_persona_request(turns, max_traits=self.max_traits, max_output_tokens=self.persona_max_tokens)])
        summary = drop_repeated_sentences(summary_resp.text)
        if not summary:
            self.count_malformed(prompts.TASK_SUMMARIZE, f"empty summary of session {session}")
            summary = " ".join(text for _, text in acted)
        if summary:
            self.events.setdefault(user_id, []).append(Event(
                f"ld-s{session}-event", summary, frozenset(tokenize(summary)), tuple(ref(t) for t, _ in acted),
                session))
            self.stats["events"] += 1
        traits, problem = prompts.parse_personas(persona_resp)
        if problem:
            self.count_malformed(prompts.TASK_LD_PERSONA, f"session {session}: {problem}")
        if traits is None:
            return
        own = {"user": {t for t, _, _, user in turns if user}, "agent": {t for t, _, _, user in turns if not user}}
        persona = self.personas.setdefault(user_id, {s: [] for s in prompts.PERSONA_SPEAKERS})
        for speaker in prompts.PERSONA_SPEAKERS:
            for t, text in traits[speaker][: self.max_traits]:
                if t is not None and t not in own[speaker]:
                    self.count_malformed(prompts.TASK_LD_PERSONA,
                                         f"session {session}: turn {t} is not one of the {speaker}'s turns")
                refs = (ref(t),) if t in own[speaker] else ()
                self._add_trait(persona[speaker], text, refs)
                self.stats[f"{speaker}_traits"] += 1

    @staticmethod
    def _add_trait(traits: list[Trait], text: str, refs: tuple[Ref, ...]) -> None:
        """Accumulates a trait: an identical text moves to the end (newest) with the new source turn first."""
        for i, old in enumerate(traits):
            if old.text == text:
                traits.append(Trait(text, tuple(dict.fromkeys((*refs, *old.refs)))))
                del traits[i]
                return
        traits.append(Trait(text, refs))

    def scores(self, queries: Sequence[Query], events: Sequence[Event]) -> np.ndarray:
        """[Q, E] (relevance + topic_weight x topic overlap) x recency (see the module docstring)."""
        rel = np.asarray(self.relevance.scores([q.utterance for q in queries], [e.text for e in events]),
                         np.float64).reshape(len(queries), len(events))
        if self.relevance.kind == "dense":
            rel = (1.0 + rel) / 2.0
        else:
            best = rel.max(axis=1, keepdims=True)
            rel = np.divide(rel, best, out=np.zeros_like(rel), where=best > 0)
        topic = np.asarray([[topic_overlap(q.utterance, e.topics) for e in events] for q in queries], np.float64)
        recency = np.asarray([[math.exp(-max(0, q.session - e.session) / self.recency_tau) for e in events]
                              for q in queries], np.float64)
        score = (rel + self.topic_weight * topic) * recency
        if self.relevance.kind == "bm25":
            score = np.where(rel > 0, score, 0.0)  # an event sharing no word is never shown
        return score

    def persona_items(self, user_id: str) -> list[Recalled]:
        """The user's and the agent's persona as shown memories (the newest `persona_shown` traits each)."""
        out = []
        for speaker in prompts.PERSONA_SPEAKERS:
            traits = self.personas.get(user_id, {}).get(speaker, [])
            shown = traits[-self.persona_shown:] if self.persona_shown else []
            if shown:
                label = "User" if speaker == "user" else "Assistant"
                out.append(Recalled(f"ld-{speaker}-persona", f"{label} persona: " + " ".join(t.text for t in shown),
                                    tuple(dict.fromkeys(r for t in shown for r in t.refs))))
        return out

    def recall(self, user_id: str, queries: Sequence[Query], *, final: bool) -> list[MemoryChoice]:
        """The top-k events by the topic-aware score, then both personas; every query scored in one call."""
        events = self.events.get(user_id, [])
        persona = self.persona_items(user_id)
        if not events and not persona:
            return [NO_MEMORY for _ in queries]
        rows = self.scores(queries, events) if events else np.zeros((len(queries), 0))
        return [choice_of([Recalled(events[i].memory_id, events[i].text, events[i].refs)
                           for i in top_indices(row, self.top_k, positive_only=self.relevance.positive_only)]
                          + persona) for row in rows]

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(), "top_k": self.top_k, "topic_weight": self.topic_weight,
                "recency_tau": self.recency_tau, "max_traits": self.max_traits, "persona_shown": self.persona_shown,
                "time_unit": "sessions", "stats": self.stats, **self.relevance.provenance()}


def build(ctx: Any) -> tuple[LDAgent, dict[str, Any]]:
    """The agent for an `EvalContext`."""
    settings = baseline_settings(ctx.config)
    block = settings["ld_agent"]
    agent = LDAgent(ctx.generator, relevance_from(block["relevance"], settings, ctx),
                    user_speaker=user_speaker_of(ctx.config), top_k=int(settings["top_k"]),
                    topic_weight=float(block["topic_weight"]), recency_tau=float(block["recency_tau"]),
                    max_traits=int(block["max_traits"]), persona_shown=int(block["persona_shown"]),
                    summary_max_tokens=int(block["summary_max_tokens"]),
                    persona_max_tokens=int(block["persona_max_tokens"]), reply=ReplySettings.from_config(ctx.config))
    return agent, agent.provenance()

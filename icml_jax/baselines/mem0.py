"""Mem0-style memory, after Chhikara et al., "Mem0: Building Production-Ready AI Agents with Scalable Long-Term
Memory" (2025): facts extracted per turn, each merged into the memory by an LLM-chosen update operation.

At every turn the agent acts on, the generator extracts candidate facts about the user from the turn (with the
recent dialogue as context; at most `baselines.mem0.max_facts`). For each fact, the `mem0.similar` stored
memories most similar to it are retrieved and shown to the generator with small integer ids (as Mem0 maps its
UUIDs), which answers one event as JSON: ADD (a new memory), UPDATE (memory id and the new text, which becomes
that memory's text; its source turns gain this turn), DELETE (memory id) or NOOP. Facts are applied one after
another, so a later fact of the same turn sees the earlier one's effect. A reply gets the top-k
(`baselines.top_k`) memories by similarity to the utterance: cosine of embeddings (`mem0.relevance = "dense"`,
Mem0's vector store; always k memories when there are k) or BM25 (only memories sharing a word). The embeddings
are the dense baseline's (`baselines.encoder_model`, `encoder.encoder_from_config`): a BERT sentence encoder
directory, e.g. all-MiniLM-L6-v2 from `python -m icml_jax.models.fetch all-minilm-l6-v2`, gives real sentence
embeddings; the default (the backbone, random with `model.kind = "tiny"`) mean-pools a decoder. `saved` is
True when the turn added or updated a memory. Simplified: no conversation summary in the extraction prompt, no
graph memory (Mem0^g), one decision call per fact rather than one per turn.

Malformed answers are counted per task (`malformed`) and fall back visibly: unusable facts become the turn's
text as the one fact; an unusable decision (bad JSON, unknown event, an id that was not shown) becomes ADD of
the fact, counted in `events["fallback_ADD"]` too.
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
class Mem0Memory:
    """One stored fact and the turns it came from (the latest first)."""

    memory_id: str
    text: str
    refs: tuple[Ref, ...]


class Mem0Agent(BaselineAgent):
    """Per-user facts maintained by ADD / UPDATE / DELETE / NOOP decisions (see the module docstring)."""

    kind = "mem0"

    def __init__(self, generator: LLMBackend, relevance: DenseRelevance | LexicalRelevance, *,
                 user_speaker: str | None, top_k: int = 3, similar: int = 5, max_facts: int = 5,
                 facts_max_tokens: int = 256, decide_max_tokens: int = 256, reply: ReplySettings | None = None
                 ) -> None:
        super().__init__(generator, user_speaker=user_speaker, reply=reply)
        if top_k < 1 or similar < 0 or max_facts < 1:
            raise ValueError(f"mem0: top_k and max_facts must be >= 1 and similar >= 0, got {top_k}, {max_facts}, "
                             f"{similar}")
        self.relevance, self.top_k, self.similar, self.max_facts = relevance, top_k, similar, max_facts
        self.facts_max_tokens, self.decide_max_tokens = facts_max_tokens, decide_max_tokens
        self.memories: dict[str, dict[str, Mem0Memory]] = {}
        self._next: dict[str, int] = {}
        self.events = {"ADD": 0, "UPDATE": 0, "DELETE": 0, "NOOP": 0, "fallback_ADD": 0}

    def forget_all(self) -> None:
        self.memories.clear()
        self._next.clear()
        self.relevance.forget()

    def memory_texts(self, user_id: str) -> list[str]:
        return [m.text for m in self.memories.get(user_id, {}).values()]

    def _ranked(self, query: str, items: Sequence[Mem0Memory], k: int) -> list[Mem0Memory]:
        """The (at most) k memories most similar to `query`, best first."""
        if not items or k <= 0:
            return []
        (row,) = self.relevance.scores([query], [m.text for m in items])
        return [items[i] for i in top_indices(row, k, positive_only=self.relevance.positive_only)]

    def construct(self, user_id: str, episode: Episode, session: int, turn: int,
                  history: Sequence[tuple[str, str]]) -> bool:
        """Extract the turn's facts, then one update decision per fact; True when a memory was added or updated."""
        spoken = episode.sessions[session].turns[turn]
        (resp,) = self.generator.generate([prompts.extract_facts_request(
            [(turn, spoken.speaker, spoken.text, True)], context=tuple(map(tuple, history)), max_facts=self.max_facts,
            max_output_tokens=self.facts_max_tokens)])
        facts, problem = prompts.parse_facts(resp)
        if problem:
            self.count_malformed(prompts.TASK_EXTRACT_FACTS, problem)
        if facts is None:
            facts = [(turn, spoken.text)]
        ref = (episode.episode_id, session, turn)
        saved = False
        for _, fact in facts[: self.max_facts]:
            saved = self._apply(user_id, fact, ref) or saved
        return saved

    def _apply(self, user_id: str, fact: str, ref: Ref) -> bool:
        """One decision for `fact`, applied; True for ADD / UPDATE."""
        bank = self.memories.setdefault(user_id, {})
        shown = self._ranked(fact, list(bank.values()), self.similar)
        ids = [str(i) for i in range(len(shown))]
        (resp,) = self.generator.generate([prompts.mem0_decide_request(
            fact, [(i, m.text) for i, m in zip(ids, shown, strict=True)], max_output_tokens=self.decide_max_tokens)])
        decision, problem = prompts.parse_decision(resp, ids)
        if decision is None:
            self.count_malformed(prompts.TASK_MEM0_DECIDE, problem or "unusable")
            self.events["fallback_ADD"] += 1
            decision = ("ADD", None, fact)
        event, shown_id, text = decision
        self.events[event] += 1
        if event == "ADD":
            n = self._next.get(user_id, 0)
            self._next[user_id] = n + 1
            memory_id = f"mem0-{n}"
            bank[memory_id] = Mem0Memory(memory_id, text or fact, (ref,))
            return True
        if event == "NOOP":
            return False
        target = shown[int(shown_id)]
        if event == "DELETE":
            del bank[target.memory_id]
            return False
        target.text = text
        target.refs = (ref, *(r for r in target.refs if r != ref))
        return True

    def recall(self, user_id: str, queries: Sequence[Query], *, final: bool) -> list[MemoryChoice]:
        """Top-k by similarity; every query scored in one call (one encoder batch)."""
        items = list(self.memories.get(user_id, {}).values())
        if not items:
            return [NO_MEMORY for _ in queries]
        scores = self.relevance.scores([q.utterance for q in queries], [m.text for m in items])
        positive = self.relevance.positive_only
        return [choice_of([Recalled(items[i].memory_id, items[i].text, items[i].refs)
                           for i in top_indices(row, self.top_k, positive_only=positive)]) for row in scores]

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(), "top_k": self.top_k, "similar": self.similar, "max_facts": self.max_facts,
                "events": self.events, **self.relevance.provenance()}


def build(ctx: Any) -> tuple[Mem0Agent, dict[str, Any]]:
    """The agent for an `EvalContext`."""
    settings = baseline_settings(ctx.config)
    block = settings["mem0"]
    agent = Mem0Agent(ctx.generator, relevance_from(block["relevance"], settings, ctx),
                      user_speaker=user_speaker_of(ctx.config), top_k=int(settings["top_k"]),
                      similar=int(block["similar"]), max_facts=int(block["max_facts"]),
                      facts_max_tokens=int(block["facts_max_tokens"]),
                      decide_max_tokens=int(block["decide_max_tokens"]),
                      reply=ReplySettings.from_config(ctx.config))
    return agent, agent.provenance()

"""MemoryBank-style memory, after Zhong et al., "MemoryBank: Enhancing Large Language Models with Long-Term
Memory" (AAAI 2024): memories summarized per session and forgotten along an Ebbinghaus curve.

At the end of each earlier session the generator writes a summary of it and extracts the facts about the user
it revealed (two LLM calls, in one back-end call; `prompts.summarize_request`, `prompts.extract_facts_request`).
Every memory (a summary or a fact) has a strength S (1 when written, +1 each time it is recalled) and the
session it was last recalled (or written) in; its retention is R = exp(-dt / S), with dt counted in SESSIONS
since that recall (the paper counts days; session gaps differ per dataset, and sessions keep the rule the same
everywhere). When a session begins, memories with R < `baselines.memorybank.retention_threshold` are
forgotten. A reply gets the top-k (`baselines.top_k`) memories by relevance x R, relevance being the cosine
similarity of embeddings mapped to [0, 1] ((1 + cos) / 2; the paper's embedding index) or BM25
(`memorybank.relevance`); with BM25 a memory sharing no word is never shown. Recalls in the earlier sessions
reinforce the memories shown; the final session reads the memory as it stands (the protocol changes no memory
there). Simplified: no global user portrait or personality summary, forgetting is deterministic (the paper's
is too), and there is no per-turn save decision (`saved` is None).

Malformed answers are counted per task (`malformed`) and fall back visibly: an empty summary becomes the
session's acted turns joined; unusable facts become the acted turns themselves, one fact each; a fact without
a usable turn id is kept without a source turn.
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


@dataclasses.dataclass
class BankMemory:
    """One MemoryBank memory: a session summary or a fact, with its strength and last recall (in sessions)."""

    memory_id: str
    kind: str  # "summary" | "fact"
    text: str
    refs: tuple[Ref, ...]
    session: int  # written at the end of this session
    strength: float = 1.0
    last_recall: int = 0

    def retention(self, now: int) -> float:
        """R = exp(-dt / S), dt = sessions since the last recall."""
        return math.exp(-max(0, now - self.last_recall) / self.strength)


class MemoryBankAgent(BaselineAgent):
    """Per-user session summaries and facts with Ebbinghaus-style forgetting (see the module docstring)."""

    kind = "memorybank"

    def __init__(self, generator: LLMBackend, relevance: DenseRelevance | LexicalRelevance, *,
                 user_speaker: str | None, top_k: int = 3, retention_threshold: float = 0.1,
                 summary_max_tokens: int = 192, facts_max_tokens: int = 512, max_facts: int = 10,
                 reply: ReplySettings | None = None) -> None:
        super().__init__(generator, user_speaker=user_speaker, reply=reply)
        if top_k < 1 or not 0.0 <= retention_threshold < 1.0:
            raise ValueError(f"memorybank: top_k must be >= 1 and retention_threshold in [0, 1), got {top_k}, "
                             f"{retention_threshold}")
        self.relevance, self.top_k, self.threshold = relevance, top_k, retention_threshold
        self.summary_max_tokens, self.facts_max_tokens, self.max_facts = summary_max_tokens, facts_max_tokens, \
            max_facts
        self.memories: dict[str, list[BankMemory]] = {}
        self.stats = {"summaries": 0, "facts": 0, "recalls": 0, "forgotten": 0}

    def forget_all(self) -> None:
        self.memories.clear()
        self.relevance.forget()

    def memory_texts(self, user_id: str) -> list[str]:
        return [m.text for m in self.memories.get(user_id, [])]

    def start_session(self, user_id: str, session: int) -> None:
        """Forgets the memories whose retention has fallen below the threshold."""
        kept = [m for m in self.memories.get(user_id, []) if m.retention(session) >= self.threshold]
        self.stats["forgotten"] += len(self.memories.get(user_id, [])) - len(kept)
        if user_id in self.memories:
            self.memories[user_id] = kept

    def end_session(self, user_id: str, episode: Episode, session: int) -> None:
        """Summary and facts of the finished session (one back-end call with both requests)."""
        turns = [(t, turn.speaker, turn.text, self.acts_on(episode, session, t))
                 for t, turn in enumerate(episode.sessions[session].turns)]
        acted = [(t, text) for t, _, text, user in turns if user]
        ref = lambda t: (episode.episode_id, session, t)  # noqa: E731
        summary_resp, facts_resp = self.generator.generate([
            prompts.summarize_request(turns, session=session, max_output_tokens=self.summary_max_tokens),
            prompts.extract_facts_request(turns, max_facts=self.max_facts, max_output_tokens=self.facts_max_tokens)])
        bank = self.memories.setdefault(user_id, [])
        summary = drop_repeated_sentences(summary_resp.text)
        if not summary:
            self.count_malformed(prompts.TASK_SUMMARIZE, f"empty summary of session {session}")
            summary = " ".join(text for _, text in acted)
        if summary:
            bank.append(BankMemory(f"s{session}-summary", "summary", summary, tuple(ref(t) for t, _ in acted),
                                   session, last_recall=session))
            self.stats["summaries"] += 1
        facts, problem = prompts.parse_facts(facts_resp)
        if facts is None:
            self.count_malformed(prompts.TASK_EXTRACT_FACTS, f"session {session}: {problem}")
            facts = list(acted)
        elif problem:
            self.count_malformed(prompts.TASK_EXTRACT_FACTS, f"session {session}: {problem}")
        valid = {t for t, _ in acted}
        for j, (t, text) in enumerate(facts[: self.max_facts]):
            refs = (ref(t),) if t in valid else ()
            if t is not None and t not in valid:
                self.count_malformed(prompts.TASK_EXTRACT_FACTS, f"session {session}: turn {t} is not a user turn")
            bank.append(BankMemory(f"s{session}-fact{j}", "fact", text, refs, session, last_recall=session))
            self.stats["facts"] += 1

    def scores(self, queries: Sequence[Query], bank: Sequence[BankMemory]) -> np.ndarray:
        """[Q, M] relevance x retention at each query's session."""
        rel = np.asarray(self.relevance.scores([q.utterance for q in queries], [m.text for m in bank]), np.float64)
        if self.relevance.kind == "dense":
            rel = (1.0 + rel) / 2.0
        retention = np.asarray([[m.retention(q.session) for m in bank] for q in queries], np.float64)
        return rel * retention

    def recall(self, user_id: str, queries: Sequence[Query], *, final: bool) -> list[MemoryChoice]:
        """Top-k by relevance x retention; outside the final session the shown memories are reinforced."""
        bank = self.memories.get(user_id, [])
        if not bank:
            return [NO_MEMORY for _ in queries]
        out = []
        for query, row in zip(queries, self.scores(queries, bank), strict=True):
            shown = [bank[i] for i in top_indices(row, self.top_k, positive_only=True)]
            if not final:
                for m in shown:
                    m.strength += 1.0
                    m.last_recall = query.session
                self.stats["recalls"] += len(shown)
            out.append(choice_of([Recalled(m.memory_id, m.text, m.refs) for m in shown]))
        return out

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(), "top_k": self.top_k, "retention_threshold": self.threshold,
                "time_unit": "sessions", "stats": self.stats, **self.relevance.provenance()}


def build(ctx: Any) -> tuple[MemoryBankAgent, dict[str, Any]]:
    """The agent for an `EvalContext`."""
    settings = baseline_settings(ctx.config)
    block = settings["memorybank"]
    agent = MemoryBankAgent(ctx.generator, relevance_from(block["relevance"], settings, ctx),
                            user_speaker=user_speaker_of(ctx.config), top_k=int(settings["top_k"]),
                            retention_threshold=float(block["retention_threshold"]),
                            summary_max_tokens=int(block["summary_max_tokens"]),
                            facts_max_tokens=int(block["facts_max_tokens"]), max_facts=int(block["max_facts"]),
                            reply=ReplySettings.from_config(ctx.config))
    return agent, agent.provenance()

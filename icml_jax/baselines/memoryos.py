"""MemoryOS-style memory, after Kang et al., "Memory OS of AI Agent" (2025): a hierarchy of short-term,
mid-term and long-term persona memory, with heat-driven promotion.

Short-term memory (STM) is a queue of the newest dialogue pages, `baselines.memoryos.short_term_pages` long;
every turn the agent acts on becomes a page (`saved` is True). When the queue is full, its oldest page
overflows (FIFO) into mid-term memory (MTM): it joins the segment most similar to it when the similarity
reaches `memoryos.segment_threshold`, else it starts a new segment. Similarity is the paper's F-score,
relevance + Jaccard overlap of content words (`memory.lexical.tokenize`) between the page and the segment's
pages, relevance being the cosine of embeddings or, with `memoryos.relevance = "bm25"`, s / (1 + s) of the BM25
score s. Every segment has a heat

    heat = visits + pages since its last promotion + exp(-sessions since its last visit / recency_tau)

(the paper's N_visit, L_interaction and R_recency with unit weights). After each page lands, every segment
whose heat reaches `memoryos.heat_threshold` is promoted: one LLM call per hot segment (in one back-end call;
`prompts.memoryos_promote_request`) rewrites the user profile and lists the facts its pages reveal, which join
the long-term persona memory (user knowledge, the newest `memoryos.max_knowledge` kept, FIFO; an identical text
once); the segment's visits and page count then restart from 0 (segments hot at the same turn are sent the same
old profile, and the last answer's profile is kept). MTM holds at most `memoryos.mid_term_segments`
segments; beyond that the coldest is dropped. A reply gets, best first: the pages (at most
`memoryos.pages_per_segment` each, by relevance) of the top-k (`baselines.top_k`) segments by relevance to the
utterance; the `memoryos.knowledge_shown` most relevant knowledge facts; the user profile; and the STM pages of
earlier sessions (the current session is the gold history already); a text is shown once. With BM25 a segment,
page or fact sharing no word is never shown. Retrieval outside the final session visits the segments shown
(heat). Time is counted in sessions. Simplified: a page is the user's turn alone (the paper pairs it with the
agent's reply and adds an LLM-written meta summary), segments have no LLM-written summary (their pages are
their text), and there is no separate assistant persona or assistant knowledge.

Malformed answers are counted per task (`malformed`) and fall back visibly: an unusable promotion answer
leaves the profile as it was and adds no fact (the segment's heat is reset all the same, so it is not re-sent
at every turn); a fact whose page id was not shown is kept without a source turn.
"""

from __future__ import annotations

import collections
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
from icml_jax.llm.types import LLMBackend
from icml_jax.memory.lexical import tokenize


@dataclasses.dataclass(frozen=True)
class Page:
    """One dialogue page: an acted turn, where it is and the session it was said in."""

    page_id: str
    text: str
    ref: Ref
    session: int

    def recalled(self) -> Recalled:
        return Recalled(self.page_id, self.text, (self.ref,))


@dataclasses.dataclass
class Segment:
    """A mid-term topic segment: its pages (oldest first) and what its heat is made of."""

    segment_id: str
    pages: list[Page]
    last_visit: int  # session
    visits: int = 0
    fresh_pages: int = 0  # pages since the last promotion (L_interaction)

    def text(self) -> str:
        return " ".join(p.text for p in self.pages)

    def heat(self, now: int, recency_tau: float) -> float:
        """visits + pages since the last promotion + exp(-sessions since the last visit / recency_tau)."""
        return self.visits + self.fresh_pages + math.exp(-max(0, now - self.last_visit) / recency_tau)


@dataclasses.dataclass
class Persona:
    """Long-term persona memory: the user profile (with the turns it was written from) and user knowledge."""

    profile: str = ""
    profile_refs: tuple[Ref, ...] = ()
    knowledge: list[Recalled] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class UserMemory:
    """One user's three tiers."""

    short: collections.deque[Page]
    mid: list[Segment] = dataclasses.field(default_factory=list)
    persona: Persona = dataclasses.field(default_factory=Persona)
    pages: int = 0
    segments: int = 0
    facts: int = 0


def jaccard(a: set[str], b: set[str]) -> float:
    """|a & b| / |a | b| (0 for two empty sets)."""
    return len(a & b) / len(a | b) if a | b else 0.0


class MemoryOSAgent(BaselineAgent):
    """Per-user short-term pages, mid-term segments with heat and a long-term persona (see the module
    docstring)."""

    kind = "memoryos"

    def __init__(self, generator: LLMBackend, relevance: DenseRelevance | LexicalRelevance, *,
                 user_speaker: str | None, top_k: int = 3, short_term_pages: int = 7,
                 mid_term_segments: int = 50, segment_threshold: float = 0.6, heat_threshold: float = 5.0,
                 recency_tau: float = 10.0, pages_per_segment: int = 3, max_knowledge: int = 100,
                 knowledge_shown: int = 5, max_facts: int = 5, promote_max_tokens: int = 384,
                 reply: ReplySettings | None = None) -> None:
        super().__init__(generator, user_speaker=user_speaker, reply=reply)
        if min(top_k, short_term_pages, mid_term_segments, pages_per_segment, max_knowledge, max_facts) < 1 \
                or knowledge_shown < 0 or heat_threshold <= 0 or recency_tau <= 0:
            raise ValueError(
                f"memoryos: top_k, short_term_pages, mid_term_segments, pages_per_segment, max_knowledge and "
                f"max_facts must be >= 1, knowledge_shown >= 0, heat_threshold and recency_tau > 0; got {top_k}, "
                f"{short_term_pages}, {mid_term_segments}, {pages_per_segment}, {max_knowledge}, {max_facts}, "
                f"{knowledge_shown}, {heat_threshold}, {recency_tau}")
        self.relevance, self.top_k = relevance, top_k
        self.short_term_pages, self.mid_term_segments = short_term_pages, mid_term_segments
        self.segment_threshold, self.heat_threshold, self.recency_tau = segment_threshold, heat_threshold, \
            recency_tau
        self.pages_per_segment, self.max_knowledge, self.knowledge_shown = pages_per_segment, max_knowledge, \
            knowledge_shown
        self.max_facts, self.promote_max_tokens = max_facts, promote_max_tokens
        self.users: dict[str, UserMemory] = {}
        self.stats = {"pages": 0, "overflowed": 0, "segments": 0, "evicted": 0, "promotions": 0, "facts": 0}

    def forget_all(self) -> None:
        self.users.clear()
        self.relevance.forget()

    def _user(self, user_id: str) -> UserMemory:
        if user_id not in self.users:
            self.users[user_id] = UserMemory(collections.deque())
        return self.users[user_id]

    def memory_texts(self, user_id: str) -> list[str]:
        mem = self.users.get(user_id)
        if mem is None:
            return []
        return ([p.text for p in mem.short] + [p.text for s in mem.mid for p in s.pages]
                + ([mem.persona.profile] if mem.persona.profile else []) + [k.text for k in mem.persona.knowledge])

    # -- construction ------------------------------------------------------------------------------

    def construct(self, user_id: str, episode: Episode, session: int, turn: int,
                  history: Sequence[tuple[str, str]]) -> bool:
        """The turn becomes an STM page; a full queue overflows its oldest page to MTM, then hot segments are
        promoted."""
        mem = self._user(user_id)
        mem.short.append(Page(f"mos-p{mem.pages}", episode.sessions[session].turns[turn].text,
                              (episode.episode_id, session, turn), session))
        mem.pages += 1
        self.stats["pages"] += 1
        while len(mem.short) > self.short_term_pages:
            self._to_mid(mem, mem.short.popleft(), session)
        self._promote(mem, session)
        return True

    def similarity(self, page: Page, segments: Sequence[Segment]) -> np.ndarray:
        """[S] relevance + content-word Jaccard of a page against each segment (the paper's F-score)."""
        rel = np.asarray(self.relevance.scores([page.text], [s.text() for s in segments]), np.float64)[0]
        if self.relevance.kind == "bm25":
            rel = rel / (1.0 + rel)
        words = set(tokenize(page.text))
        return rel + np.asarray([jaccard(words, set(tokenize(s.text()))) for s in segments], np.float64)

    def _to_mid(self, mem: UserMemory, page: Page, now: int) -> None:
        """An overflowing page joins its most similar segment (at or above the threshold) or starts one."""
        self.stats["overflowed"] += 1
        scores = self.similarity(page, mem.mid) if mem.mid else np.zeros(0)
        best = int(np.argmax(scores)) if len(scores) else -1
        if best >= 0 and scores[best] >= self.segment_threshold:
            mem.mid[best].pages.append(page)
            mem.mid[best].fresh_pages += 1
            return
        mem.mid.append(Segment(f"mos-s{mem.segments}", [page], last_visit=now, fresh_pages=1))
        mem.segments += 1
        self.stats["segments"] += 1
        if len(mem.mid) > self.mid_term_segments:  # the coldest goes (the oldest of equally cold ones)
            coldest = min(range(len(mem.mid)), key=lambda i: (mem.mid[i].heat(now, self.recency_tau), i))
            del mem.mid[coldest]
            self.stats["evicted"] += 1

    def _promote(self, mem: UserMemory, now: int) -> None:
        """Every segment whose heat reaches the threshold: profile and knowledge from its pages (one request
        each, one back-end call), then its visits and page count restart."""
        hot = [s for s in mem.mid if s.heat(now, self.recency_tau) >= self.heat_threshold]
        if not hot:
            return
        profile = mem.persona.profile
        responses = self.generator.generate([prompts.memoryos_promote_request(
            [p.text for p in s.pages], profile, max_facts=self.max_facts,
            max_output_tokens=self.promote_max_tokens) for s in hot])
        for segment, resp in zip(hot, responses, strict=True):
            segment.visits, segment.fresh_pages = 0, 0
            self.stats["promotions"] += 1
            parsed, problem = prompts.parse_promotion(resp)
            if problem:
                self.count_malformed(prompts.TASK_MEMORYOS_PROMOTE, f"segment {segment.segment_id}: {problem}")
            if parsed is None:
                continue
            new_profile, facts = parsed
            refs = []
            for page_id, text in facts[: self.max_facts]:
                if page_id is not None and not 0 <= page_id < len(segment.pages):
                    self.count_malformed(prompts.TASK_MEMORYOS_PROMOTE,
                                         f"segment {segment.segment_id}: page {page_id} was not shown")
                ref = (segment.pages[page_id].ref,) if page_id is not None and 0 <= page_id < len(segment.pages) \
                    else ()
                refs += ref
                self._add_fact(mem, text, ref)
            if new_profile:
                mem.persona.profile = new_profile
                mem.persona.profile_refs = tuple(dict.fromkeys((*refs, *mem.persona.profile_refs)))

    def _add_fact(self, mem: UserMemory, text: str, refs: tuple[Ref, ...]) -> None:
        """A fact joins the knowledge (an identical text moves to the newest end); the oldest beyond the cap go."""
        knowledge = mem.persona.knowledge
        old = next((k for k in knowledge if k.text == text), None)
        if old is not None:
            knowledge.remove(old)
            refs = tuple(dict.fromkeys((*refs, *old.refs)))
            memory_id = old.memory_id
        else:
            memory_id = f"mos-k{mem.facts}"
            mem.facts += 1
            self.stats["facts"] += 1
        knowledge.append(Recalled(memory_id, text, refs))
        del knowledge[: max(0, len(knowledge) - self.max_knowledge)]

    # -- retrieval ---------------------------------------------------------------------------------

    def _top(self, query: str, texts: Sequence[str], k: int) -> list[int]:
        if not texts or k <= 0:
            return []
        (row,) = self.relevance.scores([query], list(texts))
        return top_indices(row, k, positive_only=self.relevance.positive_only)

    def recall(self, user_id: str, queries: Sequence[Query], *, final: bool) -> list[MemoryChoice]:
        """Retrieved segments' pages, the most relevant knowledge, the profile and earlier sessions' STM pages;
        outside the final session the segments shown are visited."""
        mem = self.users.get(user_id)
        if mem is None:
            return [NO_MEMORY for _ in queries]
        out = []
        for query in queries:
            items: list[Recalled] = []
            for i in self._top(query.utterance, [s.text() for s in mem.mid], self.top_k):
                segment = mem.mid[i]
                items += [segment.pages[j].recalled() for j in self._top(
                    query.utterance, [p.text for p in segment.pages], self.pages_per_segment)]
                if not final:
                    segment.visits += 1
                    segment.last_visit = query.session
            knowledge = mem.persona.knowledge
            items += [knowledge[j] for j in self._top(query.utterance, [k.text for k in knowledge],
                                                      self.knowledge_shown)]
            if mem.persona.profile:
                items.append(Recalled("mos-profile", f"User profile: {mem.persona.profile}",
                                      mem.persona.profile_refs))
            items += [p.recalled() for p in mem.short if p.session < query.session]
            unique: dict[str, Recalled] = {}
            for item in items:  # a fact that repeats a page's text is shown once (at the better place)
                unique.setdefault(item.text, item)
            out.append(choice_of(list(unique.values())))
        return out

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(), "top_k": self.top_k, "short_term_pages": self.short_term_pages,
                "mid_term_segments": self.mid_term_segments, "segment_threshold": self.segment_threshold,
                "heat_threshold": self.heat_threshold, "recency_tau": self.recency_tau,
                "pages_per_segment": self.pages_per_segment, "max_knowledge": self.max_knowledge,
                "knowledge_shown": self.knowledge_shown, "time_unit": "sessions", "stats": self.stats,
                **self.relevance.provenance()}


def build(ctx: Any) -> tuple[MemoryOSAgent, dict[str, Any]]:
    """The agent for an `EvalContext`."""
    settings = baseline_settings(ctx.config)
    block = settings["memoryos"]
    agent = MemoryOSAgent(
        ctx.generator, relevance_from(block["relevance"], settings, ctx), user_speaker=user_speaker_of(ctx.config),
        top_k=int(settings["top_k"]), short_term_pages=int(block["short_term_pages"]),
        mid_term_segments=int(block["mid_term_segments"]), segment_threshold=float(block["segment_threshold"]),
        heat_threshold=float(block["heat_threshold"]), recency_tau=float(block["recency_tau"]),
        pages_per_segment=int(block["pages_per_segment"]), max_knowledge=int(block["max_knowledge"]),
        knowledge_shown=int(block["knowledge_shown"]), max_facts=int(block["max_facts"]),
        promote_max_tokens=int(block["promote_max_tokens"]), reply=ReplySettings.from_config(ctx.config))
    return agent, agent.provenance()

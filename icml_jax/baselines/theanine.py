"""THEANINE-style memory, after Ong et al., "Towards Lifelong Dialogue Agents via Timeline-based Memory
Management" (NAACL 2025): memories are never deleted but linked into timelines by relations, and a reply gets
the timelines through the memories relevant to it, refined by the LLM into a compact context.

Once an earlier session is over, the generator extracts its memories: the facts about the user its turns
reveal, each with its source turn (`prompts.extract_facts_request`, at most `baselines.theanine.max_facts`).
Each new memory's candidates are the `theanine.link_candidates` memories of EARLIER sessions most relevant to
it (cosine of embeddings or BM25, `theanine.relevance`; with BM25 only memories sharing a word); one request per
new memory that has candidates (all of a session's in one back-end call, `prompts.theanine_link_request`) names
the candidates it continues and the relation of each (causal or temporal). Links run from the earlier memory to
the later; a memory is never deleted or rewritten. At a reply, the top-k (`baselines.top_k`) memories by
relevance to the utterance are anchors; the timeline through an anchor is the anchor, the memories it descends
from (backward along links) and those that descend from it (forward), at most `theanine.timeline_length` of
them, nearest in links first (ties: the later session), shown oldest first, each with its relation to the
timeline step before it when that step is the memory it links to. Identical timelines are shown once. One
request per query (all queries of a recall in one back-end call, `prompts.theanine_refine_request`, with the
recent dialogue) refines the timelines into a compact context, which is the reply's memory text; its source
turns are those of every memory on the timelines shown (anchors first). Recall refines at every acted turn, as
a deployed agent would before each reply, so this baseline's call count includes those calls. Simplified:
memories are facts extracted per session rather than the paper's session-summary sentences, the relation set is
two labels, a new memory may link to any earlier related memory (not only timeline ends), and there is no
per-turn save decision (`saved` is None).

Malformed answers are counted per task (`malformed`) and fall back visibly: unusable facts become the
session's acted turns, one memory each; a fact without a usable turn id is kept without a source turn; an
unusable link answer links nothing for that memory; links to ids not shown or with an unknown relation are
ignored; an empty refinement becomes the timelines as shown to the refinement (rendered text).
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
from icml_jax.llm.generation import drop_repeated_sentences
from icml_jax.llm.types import LLMBackend


@dataclasses.dataclass
class TimelineMemory:
    """One memory, its source turns and its links: to earlier memories (id -> relation) and from later ones."""

    memory_id: str
    text: str
    refs: tuple[Ref, ...]
    session: int
    earlier: dict[str, str] = dataclasses.field(default_factory=dict)
    later: dict[str, str] = dataclasses.field(default_factory=dict)

    def recalled(self) -> Recalled:
        return Recalled(self.memory_id, self.text, self.refs)


class TheanineAgent(BaselineAgent):
    """Per-user memories linked into timelines, refined at reply time (see the module docstring)."""

    kind = "theanine"

    def __init__(self, generator: LLMBackend, relevance: DenseRelevance | LexicalRelevance, *,
                 user_speaker: str | None, top_k: int = 3, link_candidates: int = 5, timeline_length: int = 5,
                 max_facts: int = 10, facts_max_tokens: int = 512, link_max_tokens: int = 256,
                 refine_max_tokens: int = 192, reply: ReplySettings | None = None) -> None:
        super().__init__(generator, user_speaker=user_speaker, reply=reply)
        if top_k < 1 or link_candidates < 0 or timeline_length < 1 or max_facts < 1:
            raise ValueError(f"theanine: top_k, timeline_length and max_facts must be >= 1 and link_candidates >= 0, "
                             f"got {top_k}, {timeline_length}, {max_facts}, {link_candidates}")
        self.relevance, self.top_k, self.link_candidates, self.timeline_length = relevance, top_k, \
            link_candidates, timeline_length
        self.max_facts, self.facts_max_tokens, self.link_max_tokens, self.refine_max_tokens = max_facts, \
            facts_max_tokens, link_max_tokens, refine_max_tokens
        self.memories: dict[str, dict[str, TimelineMemory]] = {}
        self.stats = {"memories": 0, "links": 0, "causal": 0, "refinements": 0}

    def forget_all(self) -> None:
        self.memories.clear()
        self.relevance.forget()

    def memory_texts(self, user_id: str) -> list[str]:
        return [m.text for m in self.memories.get(user_id, {}).values()]

    # -- construction ------------------------------------------------------------------------------

    def end_session(self, user_id: str, episode: Episode, session: int) -> None:
        """The session's memories, then one link request per memory with candidates (one back-end call)."""
        turns = [(t, turn.speaker, turn.text, self.acts_on(episode, session, t))
                 for t, turn in enumerate(episode.sessions[session].turns)]
        acted = [(t, text) for t, _, text, user in turns if user]
        (resp,) = self.generator.generate([prompts.extract_facts_request(
            turns, max_facts=self.max_facts, max_output_tokens=self.facts_max_tokens)])
        facts, problem = prompts.parse_facts(resp)
        if problem:
            self.count_malformed(prompts.TASK_EXTRACT_FACTS, f"session {session}: {problem}")
        if facts is None:
            facts = list(acted)
        bank = self.memories.setdefault(user_id, {})
        earlier = [m for m in bank.values() if m.session < session]
        valid = {t for t, _ in acted}
        new = []
        for j, (t, text) in enumerate(facts[: self.max_facts]):
            if t is not None and t not in valid:
                self.count_malformed(prompts.TASK_EXTRACT_FACTS, f"session {session}: turn {t} is not a user turn")
            memory = TimelineMemory(f"th-s{session}-m{j}", text,
                                    ((episode.episode_id, session, t),) if t in valid else (), session)
            bank[memory.memory_id] = memory
            new.append(memory)
            self.stats["memories"] += 1
        self._link(new, earlier)

    def _link(self, new: Sequence[TimelineMemory], earlier: Sequence[TimelineMemory]) -> None:
        """Each new memory's relations to its most relevant earlier memories (the LLM's choice among them)."""
        if not new or not earlier or self.link_candidates <= 0:
            return
        rows = self.relevance.scores([m.text for m in new], [m.text for m in earlier])
        asks = []
        for memory, row in zip(new, rows, strict=True):
            shown = [earlier[i] for i in top_indices(row, self.link_candidates,
                                                     positive_only=self.relevance.positive_only)]
            if shown:
                asks.append((memory, shown))
        if not asks:
            return
        responses = self.generator.generate([prompts.theanine_link_request(
            memory.text, [(str(i), c.text) for i, c in enumerate(shown)], max_output_tokens=self.link_max_tokens)
            for memory, shown in asks])
        for (memory, shown), resp in zip(asks, responses, strict=True):
            links, problem = prompts.parse_links(resp, [str(i) for i in range(len(shown))])
            if problem:
                self.count_malformed(prompts.TASK_THEANINE_LINK, f"{memory.memory_id}: {problem}")
            for i, relation in links or []:
                other = shown[int(i)]
                memory.earlier[other.memory_id] = relation
                other.later[memory.memory_id] = relation
                self.stats["links"] += 1
                self.stats["causal"] += int(relation == "causal")

    # -- retrieval ---------------------------------------------------------------------------------

    def timeline(self, bank: dict[str, TimelineMemory], anchor: TimelineMemory) -> list[TimelineMemory]:
        """The anchor, its ancestors and its descendants: the `timeline_length` nearest in links (ties: the
        later session), oldest first."""
        depth = {anchor.memory_id: 0}
        for direction in ("earlier", "later"):
            frontier = [anchor]
            while frontier:
                step = []
                for m in frontier:
                    for other in getattr(m, direction):
                        if other not in depth:
                            depth[other] = depth[m.memory_id] + 1
                            step.append(bank[other])
                frontier = step
        order = list(bank)
        nearest = sorted(depth, key=lambda i: (depth[i], -bank[i].session, -order.index(i)))
        chosen = nearest[: self.timeline_length]
        return sorted((bank[i] for i in chosen), key=lambda m: (m.session, order.index(m.memory_id)))

    @staticmethod
    def steps(timeline: Sequence[TimelineMemory]) -> list[prompts.TimelineStep]:
        """A timeline as (session, text, relation to the step before when it links to it)."""
        return [(m.session, m.text, m.earlier.get(timeline[i - 1].memory_id) if i else None)
                for i, m in enumerate(timeline)]

    def recall(self, user_id: str, queries: Sequence[Query], *, final: bool) -> list[MemoryChoice]:
        """Anchors by relevance, their timelines, one refinement request per query (one back-end call)."""
        bank = self.memories.get(user_id, {})
        if not bank:
            return [NO_MEMORY for _ in queries]
        items = list(bank.values())
        rows = self.relevance.scores([q.utterance for q in queries], [m.text for m in items])
        plans: list[tuple[list[TimelineMemory], list[list[TimelineMemory]]] | None] = []
        for row in rows:
            anchors = [items[i] for i in top_indices(row, self.top_k, positive_only=self.relevance.positive_only)]
            timelines: dict[tuple[str, ...], list[TimelineMemory]] = {}
            for anchor in anchors:
                line = self.timeline(bank, anchor)
                timelines.setdefault(tuple(m.memory_id for m in line), line)
            plans.append((anchors, list(timelines.values())) if anchors else None)
        asked = [(q, p) for q, p in zip(queries, plans, strict=True) if p is not None]
        responses = self.generator.generate([prompts.theanine_refine_request(
            q.utterance, [self.steps(line) for line in lines], context=q.history,
            max_output_tokens=self.refine_max_tokens) for q, (_, lines) in asked]) if asked else []
        answers = iter(responses)
        out = []
        for plan in plans:
            if plan is None:
                out.append(NO_MEMORY)
                continue
            anchors, lines = plan
            resp = next(answers)
            self.stats["refinements"] += 1
            text = drop_repeated_sentences(resp.text)
            if not text:
                self.count_malformed(prompts.TASK_THEANINE_REFINE, "empty context")
                text = "\n\n".join(prompts.render_timeline(self.steps(line)) for line in lines)
            shown = {m.memory_id: m for m in anchors}
            for line in lines:
                shown.update((m.memory_id, m) for m in line if m.memory_id not in shown)
            out.append(choice_of([m.recalled() for m in shown.values()], text=text))
        return out

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(), "top_k": self.top_k, "link_candidates": self.link_candidates,
                "timeline_length": self.timeline_length, "max_facts": self.max_facts,
                "relations": list(prompts.THEANINE_RELATIONS), "stats": self.stats,
                **self.relevance.provenance()}


def build(ctx: Any) -> tuple[TheanineAgent, dict[str, Any]]:
    """The agent for an `EvalContext`."""
    settings = baseline_settings(ctx.config)
    block = settings["theanine"]
    agent = TheanineAgent(ctx.generator, relevance_from(block["relevance"], settings, ctx),
                          user_speaker=user_speaker_of(ctx.config), top_k=int(settings["top_k"]),
                          link_candidates=int(block["link_candidates"]),
                          timeline_length=int(block["timeline_length"]), max_facts=int(block["max_facts"]),
                          facts_max_tokens=int(block["facts_max_tokens"]),
                          link_max_tokens=int(block["link_max_tokens"]),
                          refine_max_tokens=int(block["refine_max_tokens"]),
                          reply=ReplySettings.from_config(ctx.config))
    return agent, agent.provenance()

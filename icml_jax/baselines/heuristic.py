"""Heuristic memory: our Planner and Trigger replaced by rules. Every user turn (every turn the agent acts on)
is saved as our Planner's saves are (the generator's condensed note, `save_turns`), and each reply recalls the
one memory with the highest BM25 score against the utterance (`icml_jax.memory.lexical.bm25_scores` over note
and source turn, statistics from the user's memories) when that score is > 0, else none; ties go to the newer
memory. These are the paper's "without Planner" and "without Trigger" rules together, over the whole memory
rather than our Trigger's capped candidate list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from icml_jax.baselines.common import (
    NO_MEMORY,
    Query,
    ReplySettings,
    SavesEveryTurnAgent,
    choice_of,
    recalled_fragment,
    user_speaker_of,
)
from icml_jax.evaluation.protocol import MemoryChoice
from icml_jax.memory.lexical import bm25_scores


class HeuristicAgent(SavesEveryTurnAgent):
    """Save everything; recall the BM25 top-1 when it shares a word with the utterance."""

    kind = "heuristic"

    def recall(self, user_id: str, queries: Sequence[Query], *, final: bool) -> list[MemoryChoice]:
        frags = self.fragments(user_id)
        out = []
        for query in queries:
            scores = bm25_scores(query.utterance, [f"{f.text} {f.source_text}" for f in frags])
            best = max(range(len(frags)), key=lambda i: (scores[i], i), default=None)
            out.append(NO_MEMORY if best is None or scores[best] <= 0 else choice_of([recalled_fragment(frags[best])]))
        return out

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(), "save": "every acted turn", "recall": "BM25 top-1 if its score > 0"}


def build(ctx: Any) -> tuple[HeuristicAgent, dict[str, Any]]:
    """The agent for an `EvalContext`."""
    agent = HeuristicAgent(ctx.generator, ctx.store, user_speaker=user_speaker_of(ctx.config),
                           reply=ReplySettings.from_config(ctx.config),
                           lockstep=ctx.lockstep)
    return agent, agent.provenance()

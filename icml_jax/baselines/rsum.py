"""Rsum, after Wang et al., "Recursively summarizing enables long-term dialogue memory in large language models"
(2025): one running summary per user, rewritten after every session from the previous summary
and that session's dialogue, and given to the reply as its memory.

At the end of each earlier session the generator writes the updated summary from the previous one (none
before the first session) and the session's turns (one LLM call per session; `prompts.rsum_update_request`,
at most `baselines.rsum.summary_max_tokens`). A reply gets the summary as it stands (written from the
sessions before the current one): the whole memory, with no retrieval. A summary says nothing of which turns
it kept, so its source turns (`Ref`s, which the evaluation's trigger recall reads) are every acted turn of
every session folded into it. Simplified: one prompt for the memory iteration and the reply is our reply
prompt with the summary as its memory block (the paper's response prompt differs); no per-turn save decision
(`saved` is None); the summary is not updated during the final session (the protocol changes no memory there).

Malformed answers are counted per task (`malformed`) and fall back visibly: an empty summary becomes the
previous summary followed by the session's acted turns, joined.
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
    session_turns,
    user_speaker_of,
)
from icml_jax.data.schema import Episode
from icml_jax.evaluation.protocol import MemoryChoice
from icml_jax.llm.generation import drop_repeated_sentences
from icml_jax.llm.types import LLMBackend


@dataclasses.dataclass(frozen=True)
class RunningSummary:
    """A user's summary after `session`, and the acted turns of every session it was written from."""

    text: str
    refs: tuple[Ref, ...]
    session: int


class RsumAgent(BaselineAgent):
    """One recursively updated summary per user (see the module docstring)."""

    kind = "rsum"

    def __init__(self, generator: LLMBackend, *, user_speaker: str | None, summary_max_tokens: int = 256,
                 reply: ReplySettings | None = None) -> None:
        super().__init__(generator, user_speaker=user_speaker, reply=reply)
        if summary_max_tokens < 1:
            raise ValueError(f"rsum: summary_max_tokens must be >= 1, got {summary_max_tokens}")
        self.summary_max_tokens = summary_max_tokens
        self.summaries: dict[str, RunningSummary] = {}
        self.stats = {"updates": 0}

    def forget_all(self) -> None:
        self.summaries.clear()

    def memory_texts(self, user_id: str) -> list[str]:
        current = self.summaries.get(user_id)
        return [current.text] if current else []

    def end_session(self, user_id: str, episode: Episode, session: int) -> None:
        """The summary rewritten from the previous one and the finished session (one call)."""
        turns = session_turns(self, episode, session)
        previous = self.summaries.get(user_id)
        (resp,) = self.generator.generate([prompts.rsum_update_request(
            previous.text if previous else None, turns, session=session, max_output_tokens=self.summary_max_tokens)])
        acted = [(t, text) for t, _, text, user in turns if user]
        text = drop_repeated_sentences(resp.text)
        if not text:
            self.count_malformed(prompts.TASK_RSUM_UPDATE, f"empty summary after session {session}")
            text = " ".join([*([previous.text] if previous else []), *(t for _, t in acted)])
        refs = (*(previous.refs if previous else ()), *((episode.episode_id, session, t) for t, _ in acted))
        if text:
            self.summaries[user_id] = RunningSummary(text, refs, session)
            self.stats["updates"] += 1

    def recall(self, user_id: str, queries: Sequence[Query], *, final: bool) -> list[MemoryChoice]:
        """The user's summary for every query (none before the first summary)."""
        current = self.summaries.get(user_id)
        if current is None:
            return [NO_MEMORY for _ in queries]
        shown = Recalled(f"rsum-s{current.session}", current.text, current.refs)
        return [choice_of([shown]) for _ in queries]

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(), "summary_max_tokens": self.summary_max_tokens, "stats": self.stats}


def build(ctx: Any) -> tuple[RsumAgent, dict[str, Any]]:
    """The agent for an `EvalContext`."""
    settings = baseline_settings(ctx.config)
    agent = RsumAgent(ctx.generator, user_speaker=user_speaker_of(ctx.config),
                      summary_max_tokens=int(settings["rsum"]["summary_max_tokens"]),
                      reply=ReplySettings.from_config(ctx.config))
    return agent, agent.provenance()

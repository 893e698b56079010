"""MemoChat, prompted, after Lu et al., "MemoChat: Tuning LLMs to Use Memos for Consistent Long-Range Open-Domain
Conversation" (2023): memos written per topic, a retrieval step that picks the memos a reply needs (or none),
then the reply with them (memorization, retrieval, response).

At the end of each earlier session the generator splits it into topics and writes one memo per topic: a topic
name, a summary and the ids of the turns it spans (`prompts.memochat_write_request`, JSON; one call per
session); the cited turns are the memo's source turns (`Ref`s). For each turn a reply is written for (each
acted turn of the earlier sessions, as the protocol asks what memory it would get, and every target) the
generator is shown the utterance and every memo of the user, each with an id, and picks the relevant ones, most
relevant first (`prompts.memochat_retrieve_request`, JSON; the replies of one batch in one back-end call). The
reply gets the first `baselines.top_k` picked memos as "topic: summary". Simplified: the paper's fine-tuned
model is replaced by prompts to the evaluation's generator; memos are written once per finished session
rather than when the conversation drifts to a new topic; the retrieval reads the utterance alone (not its
recent dialogue); the reply is our reply prompt with the memos as its memory block, without the memos' dialogue
turns; no per-turn save decision (`saved` is None).

Malformed answers are counted per task (`malformed`) and fall back visibly: unusable memos (bad JSON, not a
list) become one memo of the session ("session k") with its acted turns joined; a memo without a topic or
summary is left out and turn ids that are not the session's are dropped from a memo's source turns (both
counted); an unusable selection shows no memo; picked ids that were not shown are left out (counted). More
picks than `top_k` are cut to it (`stats["cut_to_top_k"]`, not malformed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
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
from icml_jax.llm.types import LLMBackend


@dataclasses.dataclass(frozen=True)
class Memo:
    """One topic memo and the turns it spans."""

    memo_id: str
    topic: str
    summary: str
    refs: tuple[Ref, ...]

    @property
    def text(self) -> str:
        return f"{self.topic}: {self.summary}"


class MemoChatAgent(BaselineAgent):
    """Per-user topic memos, picked for each reply by a retrieval call (see the module docstring)."""

    kind = "memochat"

    def __init__(self, generator: LLMBackend, *, user_speaker: str | None, top_k: int = 3,
                 memo_max_tokens: int = 384, retrieve_max_tokens: int = 64, reply: ReplySettings | None = None,
                 listed_tokens: int = 0, count_tokens: Callable[[str], int] | None = None) -> None:
        super().__init__(generator, user_speaker=user_speaker, reply=reply)
        if top_k < 1 or memo_max_tokens < 1 or retrieve_max_tokens < 1:
            raise ValueError(f"memochat: top_k, memo_max_tokens and retrieve_max_tokens must be >= 1, got {top_k}, "
                             f"{memo_max_tokens}, {retrieve_max_tokens}")
        if listed_tokens < 0 or (listed_tokens and count_tokens is None):
            raise ValueError(f"memochat: listed_tokens must be >= 0 (0: every memo) and needs count_tokens, got "
                             f"{listed_tokens}")
        self.top_k, self.memo_max_tokens, self.retrieve_max_tokens = top_k, memo_max_tokens, retrieve_max_tokens
        self.listed_tokens, self.count_tokens = listed_tokens, count_tokens
        self.memos: dict[str, list[Memo]] = {}
        self.stats = {"memos": 0, "retrievals": 0, "none_picked": 0, "cut_to_top_k": 0, "memos_not_listed": 0}

    def forget_all(self) -> None:
        self.memos.clear()

    def memory_texts(self, user_id: str) -> list[str]:
        return [m.text for m in self.memos.get(user_id, [])]

    def end_session(self, user_id: str, episode: Episode, session: int) -> None:
        """The finished session's topic memos (one call)."""
        turns = session_turns(self, episode, session)
        (resp,) = self.generator.generate([prompts.memochat_write_request(
            turns, session=session, max_output_tokens=self.memo_max_tokens)])
        written, problem = prompts.parse_memos(resp, [t for t, *_ in turns])
        if problem:
            self.count_malformed(prompts.TASK_MEMOCHAT_WRITE, f"session {session}: {problem}")
        if written is None:
            acted = [(t, text) for t, _, text, user in turns if user]
            written = [(f"session {session + 1}", " ".join(text for _, text in acted), tuple(t for t, _ in acted))]
            written = [w for w in written if w[1]]
        memos = self.memos.setdefault(user_id, [])
        for j, (topic, summary, ids) in enumerate(written):
            memos.append(Memo(f"s{session}-memo{j}", topic, summary,
                              tuple((episode.episode_id, session, t) for t in ids)))
            self.stats["memos"] += 1

    def recall(self, user_id: str, queries: Sequence[Query], *, final: bool) -> list[MemoryChoice]:
        """One retrieval request per query, all in one back-end call; the first top_k picks are shown."""
        memos = self.listed(self.memos.get(user_id, []))
        if not memos:
            return [NO_MEMORY for _ in queries]
        ids = [str(i) for i in range(len(memos))]
        listed = [(i, m.topic, m.summary) for i, m in zip(ids, memos, strict=True)]
        responses = self.generator.generate([prompts.memochat_retrieve_request(
            q.utterance, listed, max_memos=self.top_k, max_output_tokens=self.retrieve_max_tokens) for q in queries])
        out = []
        for resp in responses:
            self.stats["retrievals"] += 1
            picked, problem = prompts.parse_selection(resp, ids)
            if problem:
                self.count_malformed(prompts.TASK_MEMOCHAT_RETRIEVE, problem)
            picked = picked or []
            if len(picked) > self.top_k:
                self.stats["cut_to_top_k"] += 1
                picked = picked[: self.top_k]
            if not picked:
                self.stats["none_picked"] += 1
            out.append(choice_of([Recalled(memos[int(i)].memo_id, memos[int(i)].text, memos[int(i)].refs)
                                  for i in picked]))
        return out

    def listed(self, memos: Sequence[Memo]) -> list[Memo]:
        """The memos a retrieval request lists: every one, or with `listed_tokens` the newest whose texts fit that
        many tokens together (a small generator's window holds fewer than a long conversation's memos)."""
        if not self.listed_tokens:
            return list(memos)
        kept, used = [], 0
        for memo in reversed(memos):
            used += self.count_tokens(memo.text)
            if used > self.listed_tokens:
                break
            kept.append(memo)
        self.stats["memos_not_listed"] += len(memos) - len(kept)
        return kept[::-1]

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(), "top_k": self.top_k, "memo_max_tokens": self.memo_max_tokens,
                "retrieve_max_tokens": self.retrieve_max_tokens, "listed_tokens": self.listed_tokens,
                "stats": self.stats}


def build(ctx: Any) -> tuple[MemoChatAgent, dict[str, Any]]:
    """The agent for an `EvalContext`."""
    settings = baseline_settings(ctx.config)
    block = settings["memochat"]
    agent = MemoChatAgent(ctx.generator, user_speaker=user_speaker_of(ctx.config), top_k=int(settings["top_k"]),
                          memo_max_tokens=int(block["memo_max_tokens"]),
                          retrieve_max_tokens=int(block["retrieve_max_tokens"]),
                          reply=ReplySettings.from_config(ctx.config), listed_tokens=int(block["listed_tokens"]),
                          count_tokens=ctx.count_tokens)
    return agent, agent.provenance()

"""COMEDY, prompted, after Chen et al., "Compress to Impress: Unleashing the Potential of Compressive Memory in
Real-World Long-Term Conversations" (2025): a memory per session, compressed into one memory of the user's
profile, the user-bot relationship and past events, which the reply reads.

At the end of each earlier session the generator writes that session's memory (`prompts.comedy_session_request`,
COMEDY's session-level memory extraction), then compresses every session memory so far into one compressive
memory (`prompts.comedy_compress_request`, JSON: user_profile, relationship, events): two LLM calls per
session, the second reading the first's answer. A reply gets the compressive memory as it stands, rendered as
"User profile: ..." / "Relationship: ..." / "Past events:" lines (empty parts left out). Its source turns
(`Ref`s) are every acted turn of the sessions compressed into it: a compression says nothing of which it kept.
Simplified: the paper's single fine-tuned model (and its DPO) is replaced by prompts to the evaluation's
generator; the reply is our reply prompt with the compressive memory as its memory block; no per-turn save
decision (`saved` is None).

Malformed answers are counted per task (`malformed`) and fall back visibly: an empty session memory becomes
the session's acted turns joined (a session with neither adds no memory); an unusable compression (bad JSON,
every part empty) becomes the session memories themselves, one "Session k: ..." line each; a compression with
some parts unreadable keeps the readable ones (counted too).
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
class SessionMemory:
    """One session's memory and the acted turns it was written from."""

    session: int
    text: str
    refs: tuple[Ref, ...]


@dataclasses.dataclass(frozen=True)
class CompressiveMemory:
    """The one memory a reply reads: its parts, its rendered text and the sessions' source turns."""

    text: str
    parts: dict[str, Any]  # user_profile, relationship, events (empty when the compression fell back)
    refs: tuple[Ref, ...]
    session: int  # the last session compressed into it


def render(parts: dict[str, Any]) -> str:
    """The compressive memory as the reply's memory block (empty parts left out)."""
    lines = []
    if parts.get("user_profile"):
        lines.append(f"User profile: {parts['user_profile']}")
    if parts.get("relationship"):
        lines.append(f"Relationship: {parts['relationship']}")
    if parts.get("events"):
        lines += ["Past events:", *(f"- {e}" for e in parts["events"])]
    return "\n".join(lines)


class ComedyAgent(BaselineAgent):
    """Session memories compressed into one memory per user (see the module docstring)."""

    kind = "comedy"

    def __init__(self, generator: LLMBackend, *, user_speaker: str | None, session_max_tokens: int = 192,
                 compress_max_tokens: int = 384, reply: ReplySettings | None = None) -> None:
        super().__init__(generator, user_speaker=user_speaker, reply=reply)
        if session_max_tokens < 1 or compress_max_tokens < 1:
            raise ValueError(f"comedy: session_max_tokens and compress_max_tokens must be >= 1, got "
                             f"{session_max_tokens}, {compress_max_tokens}")
        self.session_max_tokens, self.compress_max_tokens = session_max_tokens, compress_max_tokens
        self.sessions: dict[str, list[SessionMemory]] = {}
        self.compressed: dict[str, CompressiveMemory] = {}
        self.stats = {"session_memories": 0, "compressions": 0}

    def forget_all(self) -> None:
        self.sessions.clear()
        self.compressed.clear()

    def memory_texts(self, user_id: str) -> list[str]:
        current = self.compressed.get(user_id)
        return [current.text] if current else []

    def end_session(self, user_id: str, episode: Episode, session: int) -> None:
        """The session's memory, then the compression of every session memory so far (two calls)."""
        turns = session_turns(self, episode, session)
        acted = [(t, text) for t, _, text, user in turns if user]
        (resp,) = self.generator.generate([prompts.comedy_session_request(
            turns, session=session, max_output_tokens=self.session_max_tokens)])
        text = drop_repeated_sentences(resp.text)
        if not text:
            self.count_malformed(prompts.TASK_COMEDY_SESSION, f"empty memory of session {session}")
            text = " ".join(t for _, t in acted)
        memories = self.sessions.setdefault(user_id, [])
        if text:
            memories.append(SessionMemory(session, text, tuple((episode.episode_id, session, t) for t, _ in acted)))
            self.stats["session_memories"] += 1
        if not memories:
            return
        (resp,) = self.generator.generate([prompts.comedy_compress_request(
            [(m.session, m.text) for m in memories], max_output_tokens=self.compress_max_tokens)])
        parts, problem = prompts.parse_compressive(resp)
        if problem:
            self.count_malformed(prompts.TASK_COMEDY_COMPRESS, f"after session {session}: {problem}")
        shown = render(parts) if parts is not None else ""
        if not shown:
            parts, shown = {}, "\n".join(f"Session {m.session + 1}: {m.text}" for m in memories)
        refs = tuple(r for m in memories for r in m.refs)
        self.compressed[user_id] = CompressiveMemory(shown, parts, refs, session)
        self.stats["compressions"] += 1

    def recall(self, user_id: str, queries: Sequence[Query], *, final: bool) -> list[MemoryChoice]:
        """The user's compressive memory for every query (none before the first)."""
        current = self.compressed.get(user_id)
        if current is None:
            return [NO_MEMORY for _ in queries]
        shown = Recalled(f"comedy-s{current.session}", current.text, current.refs)
        return [choice_of([shown]) for _ in queries]

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(), "session_max_tokens": self.session_max_tokens,
                "compress_max_tokens": self.compress_max_tokens, "stats": self.stats}


def build(ctx: Any) -> tuple[ComedyAgent, dict[str, Any]]:
    """The agent for an `EvalContext`."""
    block = baseline_settings(ctx.config)["comedy"]
    agent = ComedyAgent(ctx.generator, user_speaker=user_speaker_of(ctx.config),
                        session_max_tokens=int(block["session_max_tokens"]),
                        compress_max_tokens=int(block["compress_max_tokens"]),
                        reply=ReplySettings.from_config(ctx.config))
    return agent, agent.provenance()

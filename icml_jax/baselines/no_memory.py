"""No long-term memory: every reply is written from the gold history of the current session alone (the reply
prompt's memory block reads "(none)"). The lower bound of the paper's Table 1; nothing is simplified."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from icml_jax.baselines.common import NO_MEMORY, BaselineAgent, Query, ReplySettings, user_speaker_of
from icml_jax.evaluation.protocol import MemoryChoice


class NoMemoryAgent(BaselineAgent):
    """Stores nothing, recalls nothing, makes no save decision."""

    kind = "no_memory"

    def recall(self, user_id: str, queries: Sequence[Query], *, final: bool) -> list[MemoryChoice]:
        return [NO_MEMORY for _ in queries]


def build(ctx: Any) -> tuple[NoMemoryAgent, dict[str, Any]]:
    """The agent for an `EvalContext`."""
    agent = NoMemoryAgent(ctx.generator, user_speaker=user_speaker_of(ctx.config),
                          reply=ReplySettings.from_config(ctx.config))
    return agent, agent.provenance()

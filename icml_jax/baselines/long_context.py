"""Long context: every earlier session's turns go into the reply prompt, after the full-history baseline of Xu
et al. 2022 ("Beyond Goldfish Memory"), the paper's strongest non-memory baseline.

The transcript of the earlier sessions fills the prompt's memory block, session by session ("Session 2 (1 week
after the previous session):" then "speaker: text" lines), cut from the oldest turn until it fits a token
budget counted with the evaluation's tokenizer. The budget is `baselines.long_context_tokens` when set, else
what the generator's context leaves after the reply (`learner.reply_max_tokens`), the rest of this reply's
prompt and a margin (`baselines.long_context_margin`) for the chat template. The generator's context is its
model's window when it is remote (`llm.generator.context_tokens`: the paper's long-context rows use 128K and 1M
generators), else the backbone's (`max_position_embeddings` of `config.model`'s config.json; the tiny decoder's
for `model.kind == "tiny"`). Simplified: the turns of the current session before the recent dialogue window of
the reply prompt are not added; nothing is summarized.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from icml_jax.agents.tiny import tiny_model_config
from icml_jax.baselines.common import BaselineAgent, Query, Ref, ReplySettings, baseline_settings, user_speaker_of
from icml_jax.data.schema import Episode
from icml_jax.evaluation.protocol import MemoryChoice
from icml_jax.llm import prompts as llm_prompts
from icml_jax.llm.types import LLMBackend
from icml_jax.models.backbone import TINY, backbone_config
from icml_jax.models.config import ModelConfig
from icml_jax.run.runspec import RunSpec

LoggedTurn = tuple[int, str | None, Ref, str, str]  # (session, its gap text, ref, speaker, text)


def render(turns: Sequence[LoggedTurn]) -> str:
    """The memory block of `turns` (oldest first): one block per session, as `format_session_block` writes it."""
    blocks: list[tuple[int, str | None, list[tuple[str, str]]]] = []
    for session, gap, _, speaker, text in turns:
        if not blocks or blocks[-1][0] != session:
            blocks.append((session, gap, []))
        blocks[-1][2].append((speaker, text))
    return "\n\n".join(llm_prompts.format_session_block(s + 1, gap, lines, ids=False) for s, gap, lines in blocks)


def fit(turns: Sequence[LoggedTurn], budget: int, count_tokens: Callable[[str], int]) -> int:
    """The index of the oldest turn kept: the smallest start whose rendered block has at most `budget` tokens
    (len(turns) when not even the newest turn fits). Binary search, then checked exactly."""
    def fits(start: int) -> bool:
        return start >= len(turns) or count_tokens(render(turns[start:])) <= budget

    lo, hi = 0, len(turns)
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    while not fits(lo):  # token counts of a concatenation need not be monotone; never exceed the budget
        lo += 1
    return lo


class LongContextAgent(BaselineAgent):
    """Keeps each user's earlier sessions verbatim and shows the newest of them that fit the budget."""

    kind = "long_context"

    def __init__(self, generator: LLMBackend, *, user_speaker: str | None, count_tokens: Callable[[str], int],
                 budget: int | None = None, context_tokens: int | None = None, context_source: str = "backbone",
                 margin: int = 32, reply: ReplySettings | None = None) -> None:
        super().__init__(generator, user_speaker=user_speaker, reply=reply)
        if budget is None and context_tokens is None:
            raise ValueError("long_context: give a token budget or the generator's context_tokens")
        self.count_tokens, self.budget, self.context_tokens = count_tokens, budget, context_tokens
        self.context_source, self.margin = context_source, margin
        self._log: dict[str, list[LoggedTurn]] = {}

    def forget_all(self) -> None:
        self._log.clear()

    def end_session(self, user_id: str, episode: Episode, session: int) -> None:
        """Appends the finished session's transcript."""
        s = episode.sessions[session]
        self._log.setdefault(user_id, []).extend(
            (session, s.gap_text, (episode.episode_id, session, t), turn.speaker, turn.text)
            for t, turn in enumerate(s.turns))

    def memory_texts(self, user_id: str) -> list[str]:
        return [f"{speaker}: {text}" for _, _, _, speaker, text in self._log.get(user_id, [])]

    def budget_for(self, query: Query) -> int:
        """The memory block's token budget for this reply (see the module docstring)."""
        if self.budget is not None:
            return self.budget
        frame = llm_prompts.reply_request(query.history, query.utterance, None, max_output_tokens=self.reply.max_tokens)
        used = self.count_tokens(frame.system or "") + self.count_tokens(frame.prompt)
        return int(self.context_tokens) - self.reply.max_tokens - used - self.margin

    def recall(self, user_id: str, queries: Sequence[Query], *, final: bool) -> list[MemoryChoice]:
        out = []
        for query in queries:
            turns = [t for t in self._log.get(user_id, []) if t[0] < query.session]
            kept = turns[fit(turns, self.budget_for(query), self.count_tokens):]
            if not kept:
                out.append(MemoryChoice(None, None, None, None))
                continue
            refs = tuple(t[2] for t in kept)
            out.append(MemoryChoice(None, render(kept), refs[-1], None, refs))  # ref: the newest turn shown
        return out

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(), "budget_tokens": self.budget, "context_tokens": self.context_tokens,
                "context_source": self.context_source,
                "margin_tokens": self.margin,
                "budget": ("baselines.long_context_tokens" if self.budget is not None else
                           f"context_tokens ({self.context_source}) - reply_max_tokens - rest of the reply prompt "
                           "- margin")}


def backbone_context(config: Any, tokenizer) -> int:
    """`max_position_embeddings` of the run's backbone: config.model.path's config.json, or the tiny decoder's.
    `config`: the whole run config or its typed model block (a BackboneConfig)."""
    model = backbone_config(config)
    if model.kind == TINY:
        return tiny_model_config(len(tokenizer), model.hidden, model.layers).max_position_embeddings
    if not model.path:
        raise ValueError("long_context: set config.baselines.long_context_tokens or config.model.path (whose "
                         "config.json gives max_position_embeddings)")
    return ModelConfig.from_json_file(Path(model.path) / "config.json").max_position_embeddings


def generator_context(config: Any, tokenizer) -> tuple[int, str]:
    """(the generator's context in tokens, where it comes from): a remote generator's model window
    (`llm.generator.context_tokens`), else the backbone's `max_position_embeddings`."""
    remote = RunSpec.from_config(config).generator_context_tokens
    if remote is not None:
        return remote, "llm.generator.context_tokens"
    return backbone_context(config, tokenizer), "backbone max_position_embeddings"


def build(ctx: Any) -> tuple[LongContextAgent, dict[str, Any]]:
    """The agent for an `EvalContext`."""
    settings = baseline_settings(ctx.config)
    budget = settings.get("long_context_tokens")
    context, source = (None, "baselines.long_context_tokens") if budget is not None else \
        generator_context(ctx.config, ctx.tokenizer)
    agent = LongContextAgent(
        ctx.generator, user_speaker=user_speaker_of(ctx.config), count_tokens=ctx.count_tokens,
        budget=None if budget is None else int(budget), context_tokens=context, context_source=source,
        margin=int(settings["long_context_margin"]), reply=ReplySettings.from_config(ctx.config))
    return agent, agent.provenance()

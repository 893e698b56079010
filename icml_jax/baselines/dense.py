"""Dense retrieval (RAG over memory notes): every turn the agent acts on is stored, and each reply gets the
top-k memories (`baselines.top_k`, default 3) by cosine similarity between the utterance's and the memories'
embeddings, with no learning and no threshold: the standard retrieval-augmented baseline of the paper.

Stored text: the generator's memory note of the turn (its condense call via `icml_jax.memory.writer.save_turns`,
the same note our Planner's saves get), not the raw turn, so dense and ours read identical memories and differ
only in which are kept and which are shown; the note is what is embedded and shown. Embeddings come from
`baselines.encoder_model`: a BERT sentence encoder directory (`icml_jax.models.encoder.SentenceEncoder`, e.g.
all-MiniLM-L6-v2 fetched with `python -m icml_jax.models.fetch all-minilm-l6-v2`), or a decoder
(`encoder.MeanPoolEncoder`: mean-pooled final hidden states), by default the backbone at `config.model.path`;
with `model.kind == "tiny"` a random tiny decoder stands in (random features, for tests and the demo: its
ranking is not semantic). Simplified: the paper's retriever is not specified beyond dense similarity, so the
encoder is the user's choice; a plain top-k without re-ranking.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from icml_jax.baselines.common import (
    NO_MEMORY,
    Query,
    ReplySettings,
    SavesEveryTurnAgent,
    baseline_settings,
    choice_of,
    recalled_fragment,
    user_speaker_of,
)
from icml_jax.baselines.encoder import DenseRelevance, Encoder, encoder_from_config, top_indices
from icml_jax.evaluation.protocol import MemoryChoice
from icml_jax.llm.types import LLMBackend
from icml_jax.memory.store import MemoryStore


class DenseAgent(SavesEveryTurnAgent):
    """Saves every acted turn; shows the k memories most similar to the utterance (best first)."""

    kind = "dense"

    def __init__(self, generator: LLMBackend, store: MemoryStore, encoder: Encoder, *, user_speaker: str | None,
                 top_k: int = 3, reply: ReplySettings | None = None, lockstep: int = 1) -> None:
        super().__init__(generator, store, user_speaker=user_speaker, reply=reply, lockstep=lockstep)
        if top_k < 1:
            raise ValueError(f"dense: top_k must be >= 1, got {top_k}")
        self.relevance, self.top_k = DenseRelevance(encoder), top_k

    def forget_all(self) -> None:
        super().forget_all()
        self.relevance.forget()

    def recall(self, user_id: str, queries: Sequence[Query], *, final: bool) -> list[MemoryChoice]:
        """All queries and the new memories encoded in one batch."""
        frags = self.fragments(user_id)
        if not frags:
            return [NO_MEMORY for _ in queries]
        scores = self.relevance.scores([q.utterance for q in queries], [f.text for f in frags])
        return [choice_of([recalled_fragment(frags[i]) for i in top_indices(row, self.top_k, positive_only=False)])
                for row in scores]

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(), "top_k": self.top_k, "stored": "condensed note of every acted turn",
                "encoder": getattr(self.relevance.encoder, "label", type(self.relevance.encoder).__name__)}


def build(ctx: Any) -> tuple[DenseAgent, dict[str, Any]]:
    """The agent for an `EvalContext` (its encoder from `config.baselines.encoder_model` or the backbone)."""
    settings = baseline_settings(ctx.config)
    encoder = encoder_from_config(ctx.config, ctx.tokenizer, model_dir=settings.get("encoder_model"),
                                  max_length=int(settings["encoder_max_length"]))
    agent = DenseAgent(ctx.generator, ctx.store, encoder, user_speaker=user_speaker_of(ctx.config),
                       top_k=int(settings["top_k"]), reply=ReplySettings.from_config(ctx.config),
                       lockstep=ctx.lockstep)
    return agent, agent.provenance()
